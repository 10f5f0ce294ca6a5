/**
 * The server's stderr in the Output channel, at the level each line was logged with. Without this
 * the language client writes every stderr line as an error, so the server's ordinary INFO lines
 * (start, model loaded) showed as errors in the channel. No `vscode` here: tested with plain Node.
 */

export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';

/** `2026-11-23 16:56:12,811 INFO speculative_complete.lsp_server: ...`: the server's log format. */
const HEADER = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) /;

const LEVELS: Record<string, Level> = {
  DEBUG: 'debug',
  INFO: 'info',
  WARNING: 'warn',
  ERROR: 'error',
  CRITICAL: 'error',
};

/**
 * The level of one stderr line. A line without a header (a traceback's, a library's print)
 * belongs to the record above it, so it keeps that record's level; before any record, and for
 * output the server did not format, it is a warning: worth seeing, not proof of a failure.
 */
export function levelOf(line: string, previous: Level | undefined): Level {
  const name = HEADER.exec(line)?.[1];
  return name ? LEVELS[name]! : (previous ?? 'warn');
}

/** Something that logs at each level, as VS Code's LogOutputChannel does. */
export type LevelLogger = Record<Level, (message: string) => void>;

/** Feed stderr lines (in order) to `channel` at their levels. */
export function serverLogWriter(channel: LevelLogger): (line: string) => void {
  let previous: Level | undefined;
  return (line: string) => {
    previous = levelOf(line, previous);
    channel[previous](line);
  };
}
