/**
 * The LSP traffic as the editor saw it. vscode-languageclient writes every message it sends or
 * receives into the extension's output channel when `lspServer.trace.server` is
 * `{"verbosity": "verbose", "format": "json"}` and the channel logs at trace level; VS Code keeps
 * that channel in a log file. From it: the document's text at each request (didOpen + didChange
 * replayed), each inline-completion request, how it ended, and the line its answer proposes.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

export interface TraceEvent {
  type: string; // send-request, receive-response, send-notification, ...
  message: { id?: number | string; method?: string; params?: any; result?: any; error?: any };
  timestamp: number; // ms since the epoch, the extension host's clock (this machine's)
}

const LINE = /^\S+ \S+ \[trace\] (\{"isLSPMessage".*)$/;

/** The log files of the extension's output channel under a user-data folder (one per extension host). */
export function channelLogs(userData: string, channel = 'Speculative Complete'): string[] {
  const found: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) {
        walk(path);
      } else if (entry.name === `${channel}.log`) {
        found.push(path);
      }
    }
  };
  const logs = join(userData, 'logs');
  if (existsSync(logs)) {
    walk(logs);
  }
  return found.sort();
}

export function readTrace(path: string): TraceEvent[] {
  const events: TraceEvent[] = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const json = LINE.exec(line)?.[1];
    if (json) {
      events.push(JSON.parse(json) as TraceEvent);
    }
  }
  return events;
}

interface Position {
  line: number;
  character: number;
}
interface Range {
  start: Position;
  end: Position;
}

/** Offset of an LSP position (UTF-16, the negotiated encoding, as JavaScript strings are). */
function offsetOf(text: string, position: Position): number {
  let offset = 0;
  for (let line = 0; line < position.line; line++) {
    const next = text.indexOf('\n', offset);
    if (next < 0) {
      return text.length;
    }
    offset = next + 1;
  }
  return offset + position.character;
}

export function applyChange(text: string, change: { range?: Range; text: string }): string {
  if (!change.range) {
    return change.text;
  }
  return (
    text.slice(0, offsetOf(text, change.range.start)) +
    change.text +
    text.slice(offsetOf(text, change.range.end))
  );
}

function lineOf(text: string, line: number): string {
  return text.split('\n')[line] ?? '';
}

export interface InlineRequest {
  id: number | string;
  sentAt: number; // index in the event list
  /** The text of the request's line before the cursor, when it was sent. */
  typed: string;
  /** The whole line each answered item proposes (the item's edit applied to the line). */
  proposals: string[];
  /** Each answered item's text. */
  texts: string[];
  /** How it ended: answered (with or without items), cancelled by the editor, an error, or still open. */
  outcome: 'answered' | 'cancelled' | 'error' | 'pending';
  settledAt: number | undefined;
  /** Whether the document changed while it was in flight (sent, not yet answered or cancelled). */
  changedInFlight: boolean;
}

/** Every textDocument/inlineCompletion request about `uri`, in the order sent. */
export function inlineRequests(events: readonly TraceEvent[], uri: string): InlineRequest[] {
  let text = '';
  const open = new Map<number | string, InlineRequest & { line: number; character: number; text: string }>();
  const all: InlineRequest[] = [];
  events.forEach((event, index) => {
    const { method, params, id } = event.message;
    if (event.type === 'send-notification' && params?.textDocument?.uri === uri) {
      if (method === 'textDocument/didOpen') {
        text = params.textDocument.text;
      } else if (method === 'textDocument/didChange') {
        for (const change of params.contentChanges) {
          text = applyChange(text, change);
        }
        for (const request of open.values()) {
          request.changedInFlight = true;
        }
      }
    } else if (
      event.type === 'send-request' &&
      method === 'textDocument/inlineCompletion' &&
      params.textDocument.uri === uri
    ) {
      const request = {
        id: id!,
        sentAt: index,
        typed: lineOf(text, params.position.line).slice(0, params.position.character),
        proposals: [] as string[],
        texts: [] as string[],
        outcome: 'pending' as InlineRequest['outcome'],
        settledAt: undefined,
        changedInFlight: false,
        line: params.position.line,
        character: params.position.character,
        text,
      };
      open.set(id!, request);
      all.push(request);
    } else if (event.type === 'send-notification' && method === '$/cancelRequest' && open.has(params.id)) {
      settle(open.get(params.id)!, 'cancelled', index);
    } else if (event.type === 'receive-response' && id !== undefined && open.has(id)) {
      const request = open.get(id)!;
      if (event.message.error) {
        settle(request, 'error', index);
      } else if (request.outcome === 'pending') {
        const items: any[] = Array.isArray(event.message.result)
          ? event.message.result
          : (event.message.result?.items ?? []);
        request.proposals = items.map((item) =>
          proposal(request.text, request.line, request.character, item),
        );
        request.texts = items.map(insertText);
        settle(request, 'answered', index);
      }
    }
  });
  return all.map(({ id, sentAt, typed, proposals, texts, outcome, settledAt, changedInFlight }) => ({
    id,
    sentAt,
    typed,
    proposals,
    texts,
    outcome,
    settledAt,
    changedInFlight,
  }));

  function settle(request: InlineRequest, outcome: InlineRequest['outcome'], index: number): void {
    if (request.outcome === 'pending') {
      request.outcome = outcome;
      request.settledAt = index;
    }
  }
}

function insertText(item: any): string {
  return typeof item.insertText === 'string' ? item.insertText : String(item.insertText?.value ?? '');
}

/** The line an inline item proposes: its insertText over its range (the cursor when none). */
function proposal(text: string, line: number, character: number, item: any): string {
  const insert = insertText(item);
  const range: Range = item.range ?? { start: { line, character }, end: { line, character } };
  const edited = applyChange(text, { range, text: insert });
  return lineOf(edited, range.start.line);
}

/** The text of the document `uri` as the server was last told (didOpen, then each didChange). */
export function documentText(events: readonly TraceEvent[], uri: string): string | undefined {
  let text: string | undefined;
  for (const { type, message } of events) {
    if (type !== 'send-notification' || message.params?.textDocument?.uri !== uri) {
      continue;
    }
    if (message.method === 'textDocument/didOpen') {
      text = message.params.textDocument.text;
    } else if (message.method === 'textDocument/didChange' && text !== undefined) {
      for (const change of message.params.contentChanges) {
        text = applyChange(text, change);
      }
    }
  }
  return text;
}

/**
 * The texts the client told the server were accepted in `uri` (lsp_server.accepted's second
 * argument), in the order sent, each with whether its answer came back without an error (undefined
 * while none came back).
 */
export function acceptedTexts(events: readonly TraceEvent[], uri: string): { text: string; ok?: boolean }[] {
  const told = new Map<number | string, { text: string; ok?: boolean }>();
  for (const { type, message } of events) {
    const [about, text] = message.params?.arguments ?? [];
    if (
      type === 'send-request' &&
      message.method === 'workspace/executeCommand' &&
      message.params.command === 'lsp_server.accepted' &&
      about === uri
    ) {
      told.set(message.id!, { text });
    } else if (type === 'receive-response' && message.id !== undefined && told.has(message.id)) {
      told.get(message.id)!.ok = message.error === undefined;
    }
  }
  return [...told.values()];
}

/** Requests of a method sent (any document): e.g. none of textDocument/completion must be. */
export function sent(events: readonly TraceEvent[], method: string): TraceEvent[] {
  return events.filter((event) => event.type === 'send-request' && event.message.method === method);
}
