/** Progress lines of the e2e run: stderr, so they never mix with the test reporter's output. */
const started = Date.now();

export function log(message: string): void {
  process.stderr.write(`[e2e +${((Date.now() - started) / 1000).toFixed(1)}s] ${message}\n`);
}
