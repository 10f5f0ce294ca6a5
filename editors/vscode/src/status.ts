/**
 * The status bar item's text and tooltip, from the server's `lsp_server/stats` answer and what the
 * extension saw itself. No `vscode` here, so it is tested with plain Node.
 */

export const STATS_METHOD = 'lsp_server/stats';
/** The prefix of the work-done progress tokens of the server's model loads. */
export const LOAD_PROGRESS_PREFIX = 'lsp_server/load/';

/**
 * Whether a `$/progress` notification ends a model load of the server. VS Code asks for inline
 * completions only when the user types, so what was typed while the model loaded got an empty
 * answer: at this moment the extension asks again where the cursor is.
 */
export function isLoadEnd(token: string | number, value: unknown): boolean {
  return (
    typeof token === 'string' && token.startsWith(LOAD_PROGRESS_PREFIX) && record(value)['kind'] === 'end'
  );
}

export type ModelStatus = 'idle' | 'loading' | 'ready' | 'failed';

/** The fields of `lsp_server/stats` the extension uses (the server's docs/server.md lists them all). */
export interface Stats {
  requests: number;
  answered: number;
  empty: number;
  cancelled: number;
  superseded: number;
  failed: number;
  latencyMs: { p50: number; p95: number } | null;
  tokensPerPass: number | null;
  model: {
    status: ModelStatus;
    spec: string | null;
    device: string | null;
    dtype: string | null;
    error: string | null;
    loadMs: number | null;
  };
  version: string | null;
}

function record(value: unknown): Record<string, unknown> {
  return typeof value === 'object' && value !== null ? (value as Record<string, unknown>) : {};
}

function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) ? value : 0;
}

function numberOrNull(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

function stringOrNull(value: unknown): string | null {
  return typeof value === 'string' ? value : null;
}

const MODEL_STATUSES: readonly string[] = ['idle', 'loading', 'ready', 'failed'];

/** The stats from a JSON answer; undefined when it is not one (an error, another server). */
export function parseStats(answer: unknown): Stats | undefined {
  const raw = record(answer);
  const model = record(raw['model']);
  const status = model['status'];
  if (typeof status !== 'string' || !MODEL_STATUSES.includes(status)) {
    return undefined;
  }
  const latency = record(raw['latency_ms']);
  const p50 = numberOrNull(latency['p50']);
  const p95 = numberOrNull(latency['p95']);
  return {
    requests: count(raw['requests']),
    answered: count(raw['answered']),
    empty: count(raw['empty']),
    cancelled: count(raw['cancelled']),
    superseded: count(raw['superseded']),
    failed: count(raw['failed']),
    latencyMs: p50 !== null && p95 !== null ? { p50, p95 } : null,
    tokensPerPass: numberOrNull(raw['tokens_per_pass']),
    model: {
      status: status as ModelStatus,
      spec: stringOrNull(model['spec']),
      device: stringOrNull(model['device']),
      dtype: stringOrNull(model['dtype']),
      error: stringOrNull(model['error']),
      loadMs: numberOrNull(model['load_ms']),
    },
    version: stringOrNull(raw['version']),
  };
}

/** Where the language client is. */
export type ClientState = 'starting' | 'running' | 'stopped';

export interface StatusInput {
  client: ClientState;
  enabled: boolean;
  stats?: Stats | undefined;
  /** Request to answer of the last suggestion this editor asked for. */
  lastLatencyMs?: number | undefined;
  /** Why the server could not be started or stopped working. */
  error?: string | undefined;
}

export type Severity = 'normal' | 'warning' | 'error';

export interface Status {
  text: string;
  tooltip: string;
  severity: Severity;
}

const NAME = 'Speculative';

export function formatMs(ms: number): string {
  return ms >= 10_000
    ? `${(ms / 1000).toFixed(0)} s`
    : ms >= 1000
      ? `${(ms / 1000).toFixed(1)} s`
      : `${Math.round(ms)} ms`;
}

/** Lines describing the server, for the tooltip and the stats command. */
export function summary(stats: Stats, lastLatencyMs?: number): string[] {
  const model = stats.model;
  const where = [model.device, model.dtype].filter((part) => part !== null).join(', ');
  const lines = [
    `lsp_server ${stats.version ?? '?'}, model ${model.spec ?? '?'}: ${model.status}${where ? ` (${where})` : ''}`,
  ];
  if (model.status === 'ready' && model.loadMs !== null) {
    lines.push(`loaded in ${formatMs(model.loadMs)}`);
  }
  if (model.error) {
    lines.push(`error: ${model.error}`);
  }
  lines.push(
    `requests ${stats.requests}: answered ${stats.answered}, empty ${stats.empty}, ` +
      `cancelled ${stats.cancelled}, superseded ${stats.superseded}, failed ${stats.failed}`,
  );
  if (stats.latencyMs) {
    lines.push(`latency p50 ${formatMs(stats.latencyMs.p50)}, p95 ${formatMs(stats.latencyMs.p95)}`);
  }
  if (lastLatencyMs !== undefined) {
    lines.push(`last suggestion in this editor: ${formatMs(lastLatencyMs)}`);
  }
  if (stats.tokensPerPass !== null) {
    lines.push(`tokens per target pass ${stats.tokensPerPass.toFixed(2)}`);
  }
  return lines;
}

/** The status bar item: loading model / ready / last latency / off / error. */
export function statusFor(input: StatusInput): Status {
  const click = input.enabled ? 'Click to turn suggestions off.' : 'Click to turn suggestions on.';
  const details = input.stats ? summary(input.stats, input.lastLatencyMs) : [];
  const tooltip = (headline: string): string => [headline, ...details, click].join('\n');

  if (input.error) {
    return { text: `$(error) ${NAME}: error`, tooltip: tooltip(input.error), severity: 'error' };
  }
  if (input.client === 'stopped') {
    return {
      text: `$(debug-stop) ${NAME}: stopped`,
      tooltip: tooltip('The server is not running.'),
      severity: 'warning',
    };
  }
  const model = input.stats?.model;
  if (model?.status === 'failed') {
    return {
      text: `$(error) ${NAME}: model failed`,
      tooltip: tooltip(
        `The model failed to load: ${model.error ?? 'unknown error'}. Fix the lspServer.model setting.`,
      ),
      severity: 'error',
    };
  }
  if (input.client === 'starting' || !model) {
    return {
      text: `$(sync~spin) ${NAME}: starting`,
      tooltip: tooltip('Starting lsp_server.'),
      severity: 'normal',
    };
  }
  if (model.status !== 'ready') {
    return {
      text: `$(sync~spin) ${NAME}: loading model`,
      tooltip: tooltip('Loading the model.'),
      severity: 'normal',
    };
  }
  if (!input.enabled) {
    return {
      text: `$(circle-slash) ${NAME}: off`,
      tooltip: tooltip('Suggestions are off.'),
      severity: 'normal',
    };
  }
  const latency = input.lastLatencyMs !== undefined ? formatMs(input.lastLatencyMs) : 'ready';
  return { text: `$(check) ${NAME}: ${latency}`, tooltip: tooltip('Ready.'), severity: 'normal' };
}

/** How soon to ask for the stats again: often while the model loads, rarely after. */
export function nextPollMs(stats: Stats | undefined): number {
  return stats?.model.status === 'ready' || stats?.model.status === 'failed' ? 10_000 : 1_000;
}
