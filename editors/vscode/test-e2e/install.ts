/**
 * What the e2e run needs on the machine, installed when missing: Debian's chromium, libkrb5-dev
 * and ripgrep (apt), and code-server from npm, cached by version under
 * `$XDG_CACHE_HOME/lsp-speculative-complete/code-server/<version>/` so later runs skip it.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { log } from './log';

/**
 * The newest code-server that installs on Node 20: later ones need Node 22-24. Its VS Code is
 * 1.100.3, within the extension's `engines.vscode`.
 */
export const CODE_SERVER_VERSION = '4.100.3';

/**
 * Debian packages, each with a file it installs: the browser; a C++ toolchain and kerberos' headers
 * for VS Code's native modules (node-pty, spdlog, kerberos, ...); ripgrep.
 */
const APT_PACKAGES: Record<string, string> = {
  chromium: '/usr/bin/chromium',
  'build-essential': '/usr/bin/g++',
  'libkrb5-dev': '/usr/include/krb5.h',
  ripgrep: '/usr/bin/rg',
};

/**
 * The @vscode/ripgrep that code-server 4.100.3's VS Code pins (lib/vscode/npm-shrinkwrap.json),
 * which names the download cache folder, and the release asset its postinstall asks for on x64
 * Linux (its lib/postinstall.js). Both change only with CODE_SERVER_VERSION.
 */
const RIPGREP_PACKAGE = '1.15.11';
const RIPGREP_ASSET = 'ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz';

export const CHROMIUM = APT_PACKAGES['chromium']!;

export function cacheRoot(): string {
  const base = process.env['XDG_CACHE_HOME'] || join(homedir(), '.cache');
  return join(base, 'lsp-speculative-complete');
}

/** apt-get install what is missing (the machines here are root; elsewhere install them yourself). */
export function ensureAptPackages(): void {
  const missing = Object.entries(APT_PACKAGES)
    .filter(([, file]) => !existsSync(file))
    .map(([name]) => name);
  if (missing.length === 0) {
    return;
  }
  log(`apt-get install ${missing.join(' ')}`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  execFileSync('apt-get', ['update', '-qq'], { stdio: ['ignore', 'ignore', 'inherit'], env });
  execFileSync('apt-get', ['install', '-y', '-qq', ...missing], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env,
  });
}

/**
 * code-server's `out/node/entry.js`, installed first when this version is not cached.
 *
 * Its postinstall runs `npm install` inside its VS Code, whose `@vscode/ripgrep` downloads a
 * ripgrep build from GitHub, which is out of reach here: that download looks in a cache folder
 * under `os.tmpdir()` first, so the install runs with a private TMPDIR seeded with Debian's `rg`
 * packed the way the download would be. The install goes to a scratch folder renamed into place
 * at the end, so an interrupted one is never taken for a finished one.
 */
export function ensureCodeServer(): string {
  const root = join(cacheRoot(), 'code-server');
  const home = join(root, CODE_SERVER_VERSION);
  const entry = join(home, 'node_modules', 'code-server', 'out', 'node', 'entry.js');
  if (existsSync(entry)) {
    return entry;
  }
  const scratch = join(root, `${CODE_SERVER_VERSION}.partial-${process.pid}`);
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  const tmp = join(scratch, 'tmp');
  seedRipgrep(tmp);
  writeFileSync(join(scratch, 'package.json'), JSON.stringify({ name: 'code-server-cache', private: true }));
  log(`npm install code-server@${CODE_SERVER_VERSION} into ${home} (a few minutes, once)`);
  const started = Date.now();
  const result = spawnSync(
    'npm',
    ['install', '--no-audit', '--no-fund', '--no-save', `code-server@${CODE_SERVER_VERSION}`],
    {
      cwd: scratch,
      stdio: ['ignore', 'inherit', 'inherit'],
      env: {
        ...process.env,
        TMPDIR: tmp,
        // As root, code-server's postinstall refuses to run without this (npm's old unsafe-perm).
        npm_config_unsafe_perm: 'true',
        // npm 11 skips the install scripts of dependencies unless allowed, and code-server's
        // own postinstall builds VS Code's native modules (node-pty, spdlog, kerberos, ...).
        npm_config_dangerously_allow_all_scripts: 'true',
        // node-pty's install script runs `npx node-gyp`, which would ask before fetching it.
        npm_config_yes: 'true',
      },
    },
  );
  if (result.status !== 0) {
    throw new Error(`installing code-server@${CODE_SERVER_VERSION} failed (npm exit ${result.status})`);
  }
  rmSync(tmp, { recursive: true, force: true });
  rmSync(home, { recursive: true, force: true });
  renameSync(scratch, home);
  log(`code-server installed in ${Math.round((Date.now() - started) / 1000)} s`);
  return entry;
}

/** Pre-fill @vscode/ripgrep's download cache with Debian's rg, under the name it would download. */
function seedRipgrep(tmp: string): void {
  const cache = join(tmp, `vscode-ripgrep-cache-${RIPGREP_PACKAGE}`);
  const staging = join(tmp, 'rg-staging');
  mkdirSync(cache, { recursive: true });
  mkdirSync(staging, { recursive: true });
  execFileSync('cp', [APT_PACKAGES['ripgrep']!, join(staging, 'rg')]);
  execFileSync('tar', ['czf', join(cache, RIPGREP_ASSET), '-C', staging, 'rg']);
}
