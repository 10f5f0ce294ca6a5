/**
 * Processes under a given one, read from /proc (Linux): the e2e run finds the lsp_server that
 * the extension host started beneath its own code-server, never another one on the machine.
 */
import { readdirSync, readFileSync } from 'node:fs';

export interface ProcessInfo {
  pid: number;
  ppid: number;
  argv: string[];
}

function read(pid: number): ProcessInfo | undefined {
  try {
    // The comm field may hold spaces and parentheses: the fields after its last ')' are plain.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      .split('\0')
      .filter((part) => part !== '');
    return { pid, ppid, argv };
  } catch {
    return undefined; // it exited while being read
  }
}

/** Every live process whose ancestry reaches `root`. */
export function descendants(root: number): ProcessInfo[] {
  const all = readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map((name) => read(Number(name)))
    .filter((info): info is ProcessInfo => info !== undefined);
  const children = new Map<number, ProcessInfo[]>();
  for (const info of all) {
    children.set(info.ppid, [...(children.get(info.ppid) ?? []), info]);
  }
  const found: ProcessInfo[] = [];
  const queue = [root];
  while (queue.length > 0) {
    for (const child of children.get(queue.shift()!) ?? []) {
      found.push(child);
      queue.push(child.pid);
    }
  }
  return found;
}

export function isAlive(pid: number): boolean {
  return read(pid) !== undefined && !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
}
