/**
 * The language client's life: start `lsp_server --stdio` from the settings, keep the server's
 * settings in sync (or restart when the command line changes), poll its stats, and show the state
 * in the status bar. The decisions are in settings.ts and status.ts; this file wires them to VS Code.
 */
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  State,
} from 'vscode-languageclient/node';
import { ACCEPTED_COMMAND, PartialAccepts } from './partialAccept';
import { answeredItems, watchPartialAccepts } from './partialAcceptEvents';
import { serverLogWriter } from './serverLog';
import {
  explicitValue,
  launchSettings,
  needsRestart,
  SECTION,
  SERVER_KEYS,
  serverCommand,
  serverPayload,
  serverSettings,
  type Snapshot,
  whereSet,
} from './settings';
import {
  type ClientState,
  isLoadEnd,
  nextPollMs,
  parseStats,
  type Stats,
  STATS_METHOD,
  statusFor,
  summary,
} from './status';

function readSnapshot(): Snapshot {
  const config = vscode.workspace.getConfiguration(SECTION);
  const explicit: Record<string, unknown> = {};
  for (const key of SERVER_KEYS) {
    const value = explicitValue(config.inspect(key));
    if (value !== undefined) {
      explicit[key] = value;
    }
  }
  const launch = launchSettings({
    serverPath: config.get('serverPath'),
    pythonPath: config.get('pythonPath'),
    serverArgs: config.get('serverArgs'),
  });
  return { launch, explicit };
}

function pipeLines(input: Readable, write: (line: string) => void): void {
  createInterface({ input, crlfDelay: Infinity, terminal: false }).on('line', write);
}

export class Controller implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private started: Snapshot | undefined;
  private state: ClientState = 'stopped';
  private stats: Stats | undefined;
  private lastLatencyMs: number | undefined;
  private error: string | undefined;
  private pollTimer: NodeJS.Timeout | undefined;
  private generation = 0; // one per started client: a poll of an old client stops by itself
  private readonly partialAccepts = new PartialAccepts();
  private readonly watcher: vscode.Disposable;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private readonly item: vscode.StatusBarItem,
  ) {
    this.watcher = watchPartialAccepts(this.partialAccepts, (uri, text) => void this.tellAccepted(uri, text));
  }

  private enabled(): boolean {
    return vscode.workspace.getConfiguration(SECTION).get<boolean>('enabled', true);
  }

  async start(): Promise<void> {
    const snapshot = readSnapshot();
    const { command, args } = serverCommand(snapshot.launch);
    // No `transport`: the client would append a second `--stdio` to arguments that already have
    // one (serverCommand). Without it the client still talks over stdin/stdout.
    const serverOptions: ServerOptions = { command, args };
    const clientOptions: LanguageClientOptions = {
      documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
      initializationOptions: serverPayload(snapshot.explicit),
      outputChannel: this.output,
      stdioOptions: {
        // stdout is the LSP channel under stdio; the client calls this for other transports only.
        stdout: (input) => pipeLines(input, (line) => this.output.info(line)),
        stderr: (input) => pipeLines(input, serverLogWriter(this.output)),
      },
      middleware: {
        // Ghost text only. The server also offers a completion list (for editors without inline
        // completion): VS Code asked for it at every key (quick suggestions), showed the answer
        // in its suggest widget, and asked for no inline completion while that widget was open.
        provideCompletionItem: () => undefined,
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          if (!this.enabled()) {
            return null; // toggled off: not even a round trip
          }
          const sent = performance.now();
          const result = await next(document, position, context, token);
          if (!token.isCancellationRequested) {
            this.lastLatencyMs = performance.now() - sent;
            this.partialAccepts.answered(document.uri.toString(), answeredItems(result, position));
            this.render();
          }
          return result;
        },
        // VS Code runs an item's command when it is accepted whole, with the whole text: after
        // partial accepts (already told) only the rest is told.
        executeCommand: (command, args, next) => {
          const [uri, text] = args;
          if (command !== ACCEPTED_COMMAND || typeof uri !== 'string' || typeof text !== 'string') {
            return next(command, args);
          }
          const rest = this.partialAccepts.wholeAccepted(vscode.Uri.parse(uri).toString(), text);
          return rest === '' ? undefined : next(command, [uri, rest]);
        },
        handleWorkDoneProgress: (token, params, next) => {
          next(token, params);
          if (isLoadEnd(token, params) && this.enabled()) {
            void this.reask();
          }
        },
        workspace: {
          // The server asks for its section: give it only its own settings, as sent at start.
          configuration: async (params, token, next) => {
            const result = await next(params, token);
            if (!Array.isArray(result)) {
              return result;
            }
            return result.map((value: unknown, i) =>
              params.items[i]?.section === SECTION ? serverSettings(readSnapshot().explicit) : value,
            );
          },
        },
      },
    };
    const client = new LanguageClient('lspServer', 'Speculative Complete', serverOptions, clientOptions);
    client.onDidChangeState((event) => {
      this.state =
        event.newState === State.Running
          ? 'running'
          : event.newState === State.Starting
            ? 'starting'
            : 'stopped';
      this.render();
    });
    const generation = ++this.generation;
    this.client = client;
    this.started = snapshot;
    this.error = undefined;
    this.stats = undefined;
    this.state = 'starting';
    this.render();
    try {
      await client.start();
    } catch (reason) {
      this.error =
        `Could not start \`${[command, ...args].join(' ')}\`: ${String(reason)}. ` +
        'Install the project (pip install lsp-speculative-complete), ' +
        'or set lspServer.serverPath or lspServer.pythonPath.';
      this.output.error(this.error);
      this.render();
      void vscode.window.showErrorMessage(`Speculative Complete: ${this.error}`);
      return;
    }
    this.poll(generation);
  }

  async stop(): Promise<void> {
    clearTimeout(this.pollTimer);
    this.generation++;
    const client = this.client;
    this.client = undefined;
    try {
      if (client?.isRunning()) {
        await client.stop();
      }
    } catch (reason) {
      this.output.warn(`stopping the server: ${String(reason)}`);
    }
    this.state = 'stopped';
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** A settings change: the server gets its new settings, or a new process when it must. */
  async configurationChanged(): Promise<void> {
    const now = readSnapshot();
    if (!this.client?.isRunning() || !this.started || needsRestart(this.started, now)) {
      await this.restart();
      return;
    }
    await this.client.sendNotification(DidChangeConfigurationNotification.type, {
      settings: serverPayload(now.explicit),
    });
    this.render();
  }

  /** Flip `lspServer.enabled` where it is set (user settings when nowhere). */
  async toggle(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const scope = whereSet(config.inspect('enabled'));
    const target =
      scope === 'workspace' || scope === 'workspaceFolder'
        ? vscode.ConfigurationTarget.Workspace
        : vscode.ConfigurationTarget.Global;
    await config.update('enabled', !this.enabled(), target);
  }

  /** Tell the server that `text` of a suggestion in `uri` was accepted (a partial accept). */
  private async tellAccepted(uri: vscode.Uri, text: string): Promise<void> {
    const client = this.client;
    if (!client?.isRunning()) {
      return;
    }
    try {
      await client.sendRequest(ExecuteCommandRequest.type, {
        command: ACCEPTED_COMMAND,
        arguments: [client.code2ProtocolConverter.asUri(uri), text],
      });
    } catch (reason) {
      this.output.warn(`${ACCEPTED_COMMAND} failed: ${String(reason)}`);
    }
  }

  /** Ask for an inline suggestion where the cursor is now, without a keystroke. */
  private async reask(): Promise<void> {
    if (vscode.window.activeTextEditor) {
      await vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
    }
  }

  async showStats(): Promise<void> {
    const stats = await this.fetchStats();
    if (!stats) {
      void vscode.window.showWarningMessage('Speculative Complete: the server is not running.');
      return;
    }
    this.output.info(summary(stats, this.lastLatencyMs).join('\n'));
    this.output.show(true);
  }

  private async fetchStats(): Promise<Stats | undefined> {
    if (!this.client?.isRunning()) {
      return undefined;
    }
    try {
      return parseStats(await this.client.sendRequest(STATS_METHOD, {}));
    } catch (reason) {
      this.output.warn(`${STATS_METHOD} failed: ${String(reason)}`);
      return undefined;
    }
  }

  private poll(generation: number): void {
    void this.fetchStats().then((stats) => {
      if (generation !== this.generation) {
        return; // that client was stopped meanwhile
      }
      if (stats) {
        this.stats = stats;
        this.render();
      }
      this.pollTimer = setTimeout(() => this.poll(generation), nextPollMs(this.stats));
    });
  }

  render(): void {
    const status = statusFor({
      client: this.state,
      enabled: this.enabled(),
      stats: this.stats,
      lastLatencyMs: this.lastLatencyMs,
      error: this.error,
    });
    this.item.text = status.text;
    this.item.tooltip = status.tooltip;
    this.item.backgroundColor =
      status.severity === 'normal'
        ? undefined
        : new vscode.ThemeColor(
            status.severity === 'error' ? 'statusBarItem.errorBackground' : 'statusBarItem.warningBackground',
          );
    this.item.show();
  }

  dispose(): void {
    this.watcher.dispose();
    void this.stop();
  }
}
