import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import {
  SERVER_KEYS,
  explicitValue,
  launchSettings,
  needsRestart,
  serverCommand,
  serverPayload,
  serverSettings,
  type Snapshot,
  whereSet,
} from '../settings';

describe('the server command', () => {
  it('is lsp_server --stdio by default, with the extra arguments after', () => {
    assert.deepEqual(serverCommand(launchSettings({})), { command: 'lsp_server', args: ['--stdio'] });
    const launch = launchSettings({
      serverPath: ' /opt/venv/bin/lsp_server ',
      serverArgs: ['--device', 'cuda'],
    });
    assert.deepEqual(serverCommand(launch), {
      command: '/opt/venv/bin/lsp_server',
      args: ['--stdio', '--device', 'cuda'],
    });
  });

  it('runs python -m speculative_complete.lsp_server once a Python path is set, whatever serverPath', () => {
    const launch = launchSettings({
      serverPath: 'ignored',
      pythonPath: '/usr/bin/python3',
      serverArgs: ['-x'],
    });
    assert.deepEqual(serverCommand(launch), {
      command: '/usr/bin/python3',
      args: ['-m', 'speculative_complete.lsp_server', '--stdio', '-x'],
    });
  });

  it('falls back to the defaults for values of the wrong type or blank ones', () => {
    assert.deepEqual(launchSettings({ serverPath: '  ', pythonPath: 3, serverArgs: ['ok', 1] }), {
      serverPath: 'lsp_server',
      pythonPath: '',
      serverArgs: [],
    });
  });
});

describe('the settings sent to the server', () => {
  it('are the server settings the user set, nested under lspServer, launch settings left out', () => {
    const explicit = {
      model: '/models/qwen',
      maxNewTokens: 32,
      draftModel: null,
      serverPath: 'x',
      unknown: 1,
    };
    assert.deepEqual(serverSettings(explicit), { model: '/models/qwen', maxNewTokens: 32, draftModel: null });
    assert.deepEqual(serverPayload(explicit), {
      lspServer: { model: '/models/qwen', maxNewTokens: 32, draftModel: null },
    });
    assert.deepEqual(serverPayload({}), { lspServer: {} }); // defaults are the server's own
  });

  it('take the most specific scope that sets a value, null included', () => {
    assert.equal(whereSet(undefined), undefined);
    assert.equal(whereSet({ globalValue: undefined }), undefined);
    assert.equal(whereSet({ globalValue: 1 }), 'global');
    assert.equal(whereSet({ globalValue: 1, workspaceValue: 2 }), 'workspace');
    assert.equal(whereSet({ globalValue: 1, workspaceValue: 2, workspaceFolderValue: 3 }), 'workspaceFolder');
    assert.equal(explicitValue({ globalValue: 'a', workspaceValue: 'b' }), 'b');
    assert.equal(explicitValue({ globalValue: null }), null);
    assert.equal(explicitValue({}), undefined);
  });
});

describe('the remote engine settings', () => {
  it('are passed through to the server by their own names', () => {
    const explicit = {
      endpoint: 'https://gpu-box:8000/v1',
      endpointApi: 'openai',
      endpointModel: 'qwen2.5-coder-7b',
      apiKeyEnv: 'TEAM_LLM_KEY',
      caBundle: '/etc/team-ca.pem',
      allowInsecureEndpoint: false,
    };
    assert.deepEqual(serverPayload(explicit), { lspServer: explicit });
  });

  it('send a cleared endpoint (null) as such: back to the local engine', () => {
    assert.deepEqual(serverSettings({ endpoint: null }), { endpoint: null });
  });

  it('are all declared in package.json, where the user sets them', () => {
    const manifest = JSON.parse(readFileSync(join(__dirname, '..', '..', 'package.json'), 'utf8'));
    const declared = Object.keys(manifest.contributes.configuration.properties);
    for (const key of ['endpoint', 'endpointApi', 'endpointModel', 'apiKeyEnv', 'caBundle', 'allowInsecureEndpoint']) {
      assert.ok(SERVER_KEYS.includes(key as (typeof SERVER_KEYS)[number]), key);
      assert.ok(declared.includes(`lspServer.${key}`), key);
    }
  });
});

describe('a settings change', () => {
  const started: Snapshot = { launch: launchSettings({}), explicit: { maxNewTokens: 32 } };

  it('is sent as didChangeConfiguration when only server settings change', () => {
    assert.equal(
      needsRestart(started, { launch: launchSettings({}), explicit: { maxNewTokens: 16, model: 'm' } }),
      false,
    );
  });

  it('restarts the server when the command line changes', () => {
    assert.equal(
      needsRestart(started, { ...started, launch: launchSettings({ serverArgs: ['--device', 'cpu'] }) }),
      true,
    );
    assert.equal(
      needsRestart(started, { ...started, launch: launchSettings({ pythonPath: 'python3' }) }),
      true,
    );
    // a different server path behind a Python interpreter changes nothing that runs
    const python = { launch: launchSettings({ pythonPath: 'python3' }), explicit: {} };
    assert.equal(
      needsRestart(python, { ...python, launch: launchSettings({ pythonPath: 'python3', serverPath: 'x' }) }),
      false,
    );
  });

  it('restarts the server when a setting given at start is removed', () => {
    assert.equal(needsRestart(started, { launch: launchSettings({}), explicit: {} }), true);
  });
});
