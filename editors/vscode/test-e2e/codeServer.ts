/**
 * One code-server for the run: the extension packaged as a .vsix and installed into a temporary
 * extensions folder, user settings pointing it at the real lsp_server, served on a free loopback
 * port with auth and telemetry off. Stopping it ends its whole process group (extension hosts and
 * the lsp_server they started included).
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { createWriteStream, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { log } from './log';
import { waitFor } from './wait';

export const EXTENSION_DIR = resolve(__dirname, '..');

/** Package the extension the way a user would (vsce runs `vscode:prepublish`, the compile). */
export function packageExtension(into: string): string {
  const vsix = join(into, 'lsp-speculative-complete.vsix');
  const vsce = join(EXTENSION_DIR, 'node_modules', '@vscode', 'vsce', 'vsce');
  execFileSync(
    process.execPath,
    [vsce, 'package', '--allow-missing-repository', '--skip-license', '-o', vsix],
    {
      cwd: EXTENSION_DIR,
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  return vsix;
}

async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? done(address.port) : fail(new Error('no port')),
      );
    });
  });
}

function httpStatus(url: string): Promise<number | undefined> {
  return new Promise((done) => {
    const req = request(url, { timeout: 2000 }, (res) => {
      res.resume();
      done(res.statusCode);
    });
    req.on('error', () => done(undefined));
    req.on('timeout', () => req.destroy());
    req.end();
  });
}

export class CodeServer {
  readonly root = mkdtempSync(join(tmpdir(), 'lsp-vscode-e2e-'));
  readonly userData = join(this.root, 'user-data');
  readonly extensions = join(this.root, 'extensions');
  readonly workspace = join(this.root, 'workspace');
  readonly logFile = join(this.root, 'code-server.log');
  private process: ChildProcess | undefined;
  port = 0;

  constructor(private readonly entry: string) {
    for (const dir of [join(this.userData, 'User'), this.extensions, this.workspace]) {
      mkdirSync(dir, { recursive: true });
    }
  }

  get pid(): number {
    return this.process?.pid ?? -1;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/?folder=${encodeURIComponent(this.workspace)}`;
  }

  private args(): string[] {
    // A config file of its own, so nothing is written to ~/.config/code-server.
    const config = join(this.root, 'config.yaml');
    writeFileSync(config, 'auth: none\n');
    return [
      this.entry,
      '--config',
      config,
      '--user-data-dir',
      this.userData,
      '--extensions-dir',
      this.extensions,
    ];
  }

  installExtension(vsix: string): void {
    execFileSync(process.execPath, [...this.args(), '--install-extension', vsix], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
  }

  /** User settings, written before the window opens (later changes go through the Settings editor). */
  writeSettings(settings: Record<string, unknown>): void {
    writeFileSync(join(this.userData, 'User', 'settings.json'), JSON.stringify(settings, null, 2));
  }

  /** User keybindings (keybindings.json), written before the window opens. */
  writeKeybindings(bindings: { key: string; command: string; when?: string }[]): void {
    writeFileSync(join(this.userData, 'User', 'keybindings.json'), JSON.stringify(bindings, null, 2));
  }

  async start(): Promise<void> {
    this.port = await freePort();
    const args = [
      ...this.args(),
      '--bind-addr',
      `127.0.0.1:${this.port}`,
      '--auth',
      'none',
      '--disable-telemetry',
      '--disable-update-check',
      '--disable-workspace-trust',
      '--disable-getting-started-override',
      // Trace level for the extension hosts' log channels: the language client then writes the
      // LSP traffic into the extension's channel, which the checks read (trace.ts).
      '--log',
      'trace',
      this.workspace,
    ];
    const out = createWriteStream(this.logFile);
    // Its own process group, so stop() ends everything it started, and only that.
    this.process = spawn(process.execPath, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    this.process.stdout!.pipe(out);
    this.process.stderr!.pipe(out);
    log(`code-server pid ${this.pid} on port ${this.port}, files in ${this.root}`);
    // A run ended early (a signal, a crash) still ends the group: it is detached from ours.
    const group = this.pid;
    const kill = (): void => {
      try {
        process.kill(-group, 'SIGKILL');
      } catch {
        // gone already
      }
    };
    process.once('exit', kill);
    for (const signal of ['SIGINT', 'SIGTERM'] as const) {
      process.once(signal, () => {
        kill();
        process.exit(128 + (signal === 'SIGINT' ? 2 : 15));
      });
    }
    await waitFor(
      'code-server to answer /healthz',
      async () => (await httpStatus(`http://127.0.0.1:${this.port}/healthz`)) === 200,
      60_000,
    );
  }

  async stop(): Promise<void> {
    const child = this.process;
    if (!child?.pid || child.exitCode !== null) {
      return;
    }
    const exited = new Promise((done) => child.once('exit', done));
    try {
      process.kill(-child.pid, 'SIGTERM');
    } catch {
      return; // already gone
    }
    await Promise.race([exited, new Promise((done) => setTimeout(done, 10_000).unref())]);
    try {
      process.kill(-child.pid, 'SIGKILL'); // anything that ignored SIGTERM
    } catch {
      // all gone
    }
  }
}
