/**
 * The extension's logic against the real server: the command line serverCommand() builds starts
 * lsp_server, the payloads serverPayload() builds are the settings it applies (and no key it does
 * not know), and statusFor() reads its real stats. Speaks LSP with vscode-jsonrpc, the library
 * under vscode-languageclient, since VS Code itself cannot run here. Skipped when lsp_server is not
 * on PATH, except under CI (which runs it inside the project's virtual environment).
 */
import assert from 'node:assert/strict';
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import {
  createMessageConnection,
  type MessageConnection,
  StreamMessageReader,
  StreamMessageWriter,
} from 'vscode-jsonrpc/node';
import { launchSettings, serverCommand, serverPayload, serverSettings } from '../settings';
import { isLoadEnd, parseStats, type Stats, STATS_METHOD, statusFor } from '../status';

const LOAD_TIMEOUT_MS = 180_000; // hang guard only: the first start on a machine converts the model
const URI = 'file:///work/point.py';
const POINT = 'class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y';

const launch = launchSettings({ serverArgs: ['--log-level', 'WARNING'] });
const command = serverCommand(launch);
const installed = spawnSync(command.command, ['--version']).status === 0;
// What a user could have set; timeBudgetMs is roomy: this checks behaviour, not a loaded machine's speed.
const explicit = { maxNewTokens: 24, drafter: 'ngram', timeBudgetMs: 60_000, serverPath: 'lsp_server' };

const skip = installed || process.env['CI'] ? false : `${command.command} is not on PATH`;

describe('the extension logic against lsp_server', { skip }, () => {
  let server: ChildProcessWithoutNullStreams;
  let connection: MessageConnection;
  let stderr = '';
  const progress: { token: string | number; value: unknown }[] = []; // every $/progress, in order

  async function stats(): Promise<{ raw: Record<string, unknown>; stats: Stats }> {
    const raw = await connection.sendRequest<Record<string, unknown>>(STATS_METHOD, {});
    const parsed = parseStats(raw);
    assert.ok(parsed, `not a stats answer: ${JSON.stringify(raw)}`);
    return { raw, stats: parsed };
  }

  function inline(): Promise<{ items: { insertText: string }[] }> {
    return connection.sendRequest('textDocument/inlineCompletion', {
      textDocument: { uri: URI },
      position: { line: 3, character: 14 },
      context: { triggerKind: 1 },
    });
  }

  before(async () => {
    server = spawn(command.command, command.args, { stdio: 'pipe' });
    server.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    connection = createMessageConnection(
      new StreamMessageReader(server.stdout),
      new StreamMessageWriter(server.stdin),
    );
    connection.onRequest('window/workDoneProgress/create', () => null);
    connection.onRequest('workspace/configuration', () => [serverSettings(explicit)]);
    connection.onNotification(() => undefined);
    connection.onUnhandledProgress((params) => progress.push(params));
    connection.listen();
    const result = await connection.sendRequest<{ capabilities: Record<string, unknown> }>('initialize', {
      processId: process.pid,
      rootUri: null,
      capabilities: { window: { workDoneProgress: true }, textDocument: { inlineCompletion: {} } },
      initializationOptions: serverPayload(explicit),
    });
    assert.ok(result.capabilities['inlineCompletionProvider'], 'the server offers inline completion');
    await connection.sendNotification('initialized', {});
  });

  after(async () => {
    if (server.exitCode === null) {
      server.kill();
    }
    connection?.dispose();
  });

  it('loads the model while the status says so, then says ready', async () => {
    const deadline = Date.now() + LOAD_TIMEOUT_MS;
    for (;;) {
      const { stats: current } = await stats();
      const text = statusFor({ client: 'running', enabled: true, stats: current }).text;
      if (current.model.status === 'ready') {
        assert.equal(text, '$(check) Speculative: ready');
        return;
      }
      assert.notEqual(current.model.status, 'failed', current.model.error ?? '');
      assert.match(text, /^\$\(sync~spin\) Speculative: (loading model|starting)$/);
      assert.ok(Date.now() < deadline, 'the model never loaded');
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  });

  it('ends the load with the progress end the extension asks again at, and only then', async () => {
    const deadline = Date.now() + 30_000; // the end follows the ready state by a message
    while (!progress.some(({ token, value }) => isLoadEnd(token, value))) {
      assert.ok(Date.now() < deadline, `no load end among ${JSON.stringify(progress)}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const ends = progress.filter(({ token, value }) => isLoadEnd(token, value));
    assert.equal(ends.length, 1);
    const token = ends[0]?.token;
    const kinds = progress.filter((p) => p.token === token).map((p) => (p.value as { kind: string }).kind);
    assert.equal(kinds[0], 'begin');
    assert.equal(kinds.at(-1), 'end');
    assert.ok(kinds.slice(0, -1).every((kind) => kind !== 'end'));
  });

  it('applies the settings from initializationOptions', async () => {
    const { raw } = await stats();
    const settings = raw['settings'] as Record<string, unknown>;
    assert.equal(settings['maxNewTokens'], 24);
    assert.equal(settings['drafter'], 'ngram');
    assert.equal(settings['timeBudgetMs'], 60_000);
  });

  it('suggests the rest of the line, and the status shows the latency', async () => {
    await connection.sendNotification('textDocument/didOpen', {
      textDocument: { uri: URI, languageId: 'python', version: 1, text: POINT },
    });
    const sent = performance.now();
    const answer = await inline();
    const latency = performance.now() - sent;
    assert.deepEqual(
      answer.items.map((item) => item.insertText),
      [' = y'],
    );
    const { stats: current } = await stats();
    assert.equal(current.answered, 1);
    const status = statusFor({ client: 'running', enabled: true, stats: current, lastLatencyMs: latency });
    assert.match(status.text, /^\$\(check\) Speculative: \d+(\.\d)? m?s$/);
  });

  it('stops suggesting when the toggle sends enabled: false', async () => {
    await connection.sendNotification('workspace/didChangeConfiguration', {
      settings: serverPayload({ ...explicit, enabled: false }),
    });
    assert.deepEqual((await inline()).items, []);
    const { raw } = await stats();
    assert.equal((raw['settings'] as Record<string, unknown>)['enabled'], false);
  });

  it('shuts down cleanly, having warned about nothing (no unknown setting)', async () => {
    await connection.sendRequest('shutdown');
    const exited = new Promise<number | null>((resolve) => server.on('exit', (code) => resolve(code)));
    await connection.sendNotification('exit');
    assert.equal(await exited, 0);
    assert.equal(stderr, '');
  });
});
