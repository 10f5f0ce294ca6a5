/** Waiting on conditions: every wait polls a condition and names it when it times out. */
import { setTimeout as delay } from 'node:timers/promises';

/** Poll `probe` until it returns something other than undefined/false/null; its value. */
export async function waitFor<T>(
  what: string,
  probe: () => T | undefined | null | false | Promise<T | undefined | null | false>,
  timeoutMs: number,
  explain?: () => string,
): Promise<T> {
  const intervalMs = 100;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== null && value !== false) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${explain ? `\n${explain()}` : ''}`,
      );
    }
    await delay(intervalMs);
  }
}
