/**
 * The extension's settings (section `lspServer`) and what they become: the server's command line,
 * its `initializationOptions` and `workspace/didChangeConfiguration` payloads. No `vscode` here, so
 * it is tested with plain Node.
 */

export const SECTION = 'lspServer';

/** The settings the server itself reads (its README, "Settings"), by the same names. */
export const SERVER_KEYS = [
  'model',
  'draftModel',
  'draftHead',
  'drafter',
  'device',
  'dtype',
  'quantization',
  'maxNewTokens',
  'contextTokens',
  'debounceMs',
  'timeBudgetMs',
  'enabled',
  'multiline',
  // a remote engine (the server's README, "Remote engines"); the key itself is never a setting
  'endpoint',
  'endpointApi',
  'endpointModel',
  'apiKeyEnv',
  'caBundle',
  'allowInsecureEndpoint',
] as const;

export type ServerKey = (typeof SERVER_KEYS)[number];
export type ServerSettings = Partial<Record<ServerKey, unknown>>;

/** The settings only the extension reads: how to start the server. */
export interface LaunchSettings {
  serverPath: string;
  pythonPath: string;
  serverArgs: readonly string[];
}

export const DEFAULT_LAUNCH: LaunchSettings = { serverPath: 'lsp_server', pythonPath: '', serverArgs: [] };

export interface ServerCommand {
  command: string;
  args: string[];
}

/** What `WorkspaceConfiguration.inspect(key)` says about one setting (the fields used here). */
export interface Inspection {
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

export type Scope = 'global' | 'workspace' | 'workspaceFolder';

/** The most specific scope that sets the value, or undefined when only the default applies. */
export function whereSet(inspection: Inspection | undefined): Scope | undefined {
  if (inspection?.workspaceFolderValue !== undefined) {
    return 'workspaceFolder';
  }
  if (inspection?.workspaceValue !== undefined) {
    return 'workspace';
  }
  return inspection?.globalValue !== undefined ? 'global' : undefined;
}

/** The value a user set (null included: `draftModel: null` means none), or undefined. */
export function explicitValue(inspection: Inspection | undefined): unknown {
  const scope = whereSet(inspection);
  return scope === undefined ? undefined : inspection?.[`${scope}Value`];
}

function isStringList(value: unknown): value is string[] {
  return Array.isArray(value) && value.every((item) => typeof item === 'string');
}

/** Launch settings from raw values (what `config.get` returns); wrong types fall back to defaults. */
export function launchSettings(raw: Record<string, unknown>): LaunchSettings {
  const text = (value: unknown, fallback: string): string =>
    typeof value === 'string' ? value.trim() : fallback;
  return {
    serverPath: text(raw['serverPath'], DEFAULT_LAUNCH.serverPath) || DEFAULT_LAUNCH.serverPath,
    pythonPath: text(raw['pythonPath'], DEFAULT_LAUNCH.pythonPath),
    serverArgs: isStringList(raw['serverArgs']) ? [...raw['serverArgs']] : [...DEFAULT_LAUNCH.serverArgs],
  };
}

/**
 * `python -m speculative_complete.lsp_server --stdio ...` when a Python interpreter is set, else
 * `lsp_server --stdio ...`.
 */
export function serverCommand(launch: LaunchSettings): ServerCommand {
  if (launch.pythonPath) {
    return {
      command: launch.pythonPath,
      args: ['-m', 'speculative_complete.lsp_server', '--stdio', ...launch.serverArgs],
    };
  }
  return { command: launch.serverPath, args: ['--stdio', ...launch.serverArgs] };
}

/**
 * The server's settings among those the user set. Only explicit values are sent, so a default
 * never overrides a flag given in `serverArgs` (`--model ...`); the server validates the values
 * and says which one it rejected.
 */
export function serverSettings(explicit: Readonly<Record<string, unknown>>): ServerSettings {
  const settings: ServerSettings = {};
  for (const key of SERVER_KEYS) {
    if (explicit[key] !== undefined) {
      settings[key] = explicit[key];
    }
  }
  return settings;
}

/** The payload of `initializationOptions` and of `workspace/didChangeConfiguration`. */
export function serverPayload(explicit: Readonly<Record<string, unknown>>): { [SECTION]: ServerSettings } {
  return { [SECTION]: serverSettings(explicit) };
}

/** What the server was started with, to compare with later settings. */
export interface Snapshot {
  launch: LaunchSettings;
  explicit: Readonly<Record<string, unknown>>;
}

/**
 * Whether a change of settings needs a new server process rather than a
 * `didChangeConfiguration`: the command line changed, or a setting passed at initialization is no
 * longer set (the server would fall back to its initialization value, not to the default).
 */
export function needsRestart(started: Snapshot, now: Snapshot): boolean {
  const before = serverCommand(started.launch);
  const after = serverCommand(now.launch);
  if (before.command !== after.command || before.args.join('\0') !== after.args.join('\0')) {
    return true;
  }
  return SERVER_KEYS.some((key) => started.explicit[key] !== undefined && now.explicit[key] === undefined);
}
