import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Level, levelOf, serverLogWriter } from '../serverLog';

describe('the server log in the Output channel', () => {
  it('keeps the level of each record lsp_server wrote', () => {
    const at = (name: string): Level =>
      levelOf(`2026-11-23 16:56:12,811 ${name} speculative_complete.lsp_server: hello`, undefined);
    assert.deepEqual(['DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'].map(at), [
      'debug',
      'info',
      'warn',
      'error',
      'error',
    ]);
  });

  it('gives a traceback the level of the record it belongs to', () => {
    const written: [Level, string][] = [];
    const to =
      (level: Level) =>
      (line: string): void => {
        written.push([level, line]);
      };
    const channel = {
      trace: to('trace'),
      debug: to('debug'),
      info: to('info'),
      warn: to('warn'),
      error: to('error'),
    };
    const write = serverLogWriter(channel);
    for (const line of [
      'a line before any record',
      '2026-11-23 16:56:12,811 INFO speculative_complete.lsp_server: lsp_server 0.1.0 starting (stdio)',
      '2026-11-23 16:56:13,000 ERROR speculative_complete.lsp_server.completion: decode failed',
      'Traceback (most recent call last):',
      '  File "x.py", line 1',
      '2026-11-23 16:56:14,000 INFO speculative_complete.lsp_server: done',
    ]) {
      write(line);
    }
    assert.deepEqual(
      written.map(([level]) => level),
      ['warn', 'info', 'error', 'error', 'error', 'info'],
    );
  });
});
