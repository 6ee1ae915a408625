import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';

/*
 * The test command runs Jest with the checks that no clock governs beside it, at the lowest CPU
 * priority. Jest's simulator tests wait on clocks scaled to real time more than they compute: its three
 * workers keep about 1.2 of the machine's two cores busy. The checks (the protocol checker, the integ
 * snapshots, eslint) fill the rest, and at a niceness of 19 (a weight of 15 against Jest's 1,024) they
 * take almost nothing from Jest's timing-sensitive tests (see DETACH). Nothing with a simulated clock may run here:
 * starved of CPU, its clock would run on without it.
 *
 * The checks run one after another; each one's output is printed after Jest's, under its command. The
 * exit code is Jest's when Jest failed, else the first failed check's. A signal stops them all.
 *
 * Usage: ts-node projenrc/run-beside.ts --beside 'COMMAND' [--beside 'COMMAND' ...] -- PROGRAM [ARGS...]
 */

interface Check {
  readonly command: string;
  output: Buffer[];
  code?: number;
  seconds?: number;
}

function parse(argv: string[]): { checks: Check[]; program: string[] } {
  const checks: Check[] = [];
  let i = 0;
  for (; i < argv.length && argv[i] !== '--'; i += 2) {
    if (argv[i] !== '--beside' || argv[i + 1] === undefined) {
      throw new Error(`usage: run-beside.ts --beside 'COMMAND' [--beside 'COMMAND' ...] -- PROGRAM [ARGS...]; got: ${argv.join(' ')}`);
    }
    checks.push({ command: argv[i + 1], output: [] });
  }
  const program = argv.slice(i + 1);
  if (program.length === 0) throw new Error('run-beside.ts: no program after --');
  return { checks, program };
}

/** Exit code of a child: its code, or 128 + the signal's number when a signal ended it. */
function exitCode(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return signalCode(signal!);
}

/** The shell's exit code for a process ended by `signal`: 128 + its number. */
function signalCode(signal: NodeJS.Signals): number {
  return 128 + (os.constants.signals[signal] ?? 0);
}

/**
 * A detached child leads a session of its own, and where Linux groups the scheduling of each session
 * (`CONFIG_SCHED_AUTOGROUP`, on by default), CPU is first shared between sessions, each with the weight
 * of its group's niceness: a niceness of 19 inside the session alone then changed nothing (measured: a
 * detached CPU-bound check took a whole core of two from Jest's workers). So a check is detached only
 * where its session's group can be niced too, or where there are no groups (the process's own niceness
 * does it); elsewhere it stays in this session, and a stop reaches only its shell.
 */
const AUTOGROUPS = readOr('/proc/sys/kernel/sched_autogroup_enabled', '0').trim() === '1' && fs.existsSync('/proc/self/autogroup');
// (Windows has no process groups to stop together: a check stays attached there.)
const DETACH = process.platform !== 'win32' && (!AUTOGROUPS || writable('/proc/self/autogroup'));

function readOr(file: string, otherwise: string): string {
  try {
    return fs.readFileSync(file, 'utf-8');
  } catch {
    return otherwise;
  }
}

function writable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

function lowerSessionPriority(pid: number | undefined): void {
  if (!DETACH || !AUTOGROUPS || pid === undefined) return;
  try {
    fs.writeFileSync(`/proc/${pid}/autogroup`, '19');
  } catch (e) {
    // ENOENT and ESRCH: the check has exited already. Anything else: it runs, but at Jest's priority.
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== 'ENOENT' && code !== 'ESRCH') console.error(`run-beside.ts: could not lower the priority of a check's session: ${(e as Error).message}`);
  }
}

/**
 * A check's command at the lowest priority: under `nice -n 19 sh -c` where there is a POSIX shell, so
 * that every process it starts inherits the niceness from its first instruction; on Windows (no `nice`,
 * no `sh`) in the platform's shell, lowered once started (the processes it has started by then keep
 * their priority).
 */
function spawnNiced(command: string, detached: boolean): ChildProcess {
  const stdio: ['ignore', 'pipe', 'pipe'] = ['ignore', 'pipe', 'pipe'];
  if (process.platform !== 'win32') return spawn('nice', ['-n', '19', 'sh', '-c', command], { detached, stdio });
  const child = spawn(command, { shell: true, stdio });
  try {
    if (child.pid !== undefined) os.setPriority(child.pid, os.constants.priority.PRIORITY_LOW);
  } catch {
    // the check has exited already
  }
  return child;
}

async function main(): Promise<number> {
  const { checks, program } = parse(process.argv.slice(2));
  let current: ChildProcess | undefined;
  let stopped: NodeJS.Signals | undefined;

  // In a process group of their own (detached, see DETACH), so that a stop reaches every process a check started.
  const runChecks = (async () => {
    for (const check of checks) {
      if (stopped) break;
      const started = Date.now();
      check.code = await new Promise<number>((resolve) => {
        const child = spawnNiced(check.command, DETACH);
        current = child;
        lowerSessionPriority(child.pid);
        child.stdout!.on('data', (chunk: Buffer) => check.output.push(chunk));
        child.stderr!.on('data', (chunk: Buffer) => check.output.push(chunk));
        child.on('error', (e) => {
          check.output.push(Buffer.from(`${e.message}\n`));
          resolve(127);
        });
        child.on('close', (code, signal) => resolve(exitCode(code, signal)));
      });
      check.seconds = (Date.now() - started) / 1000;
      current = undefined;
    }
  })();

  let foreground: ChildProcess | undefined;
  // A signal to this process goes on to the program and to the running check's whole process group (a
  // Ctrl-C at the terminal reaches the program by itself too: it shares the terminal's process group).
  const stop = (signal: NodeJS.Signals) => {
    stopped = signal;
    foreground?.kill(signal);
    if (current?.pid !== undefined) {
      try {
        if (DETACH) process.kill(-current.pid, signal);
        else current.kill(signal);
      } catch {
        // the check has exited already
      }
    }
  };
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as NodeJS.Signals[]) process.on(signal, () => stop(signal));

  const programCode = await new Promise<number>((resolve) => {
    const child = spawn(program[0], program.slice(1), { stdio: 'inherit' });
    foreground = child;
    child.on('error', (e) => {
      console.error(`${program[0]}: ${e.message}`);
      resolve(127);
    });
    child.on('close', (code, signal) => resolve(exitCode(code, signal)));
  });

  const waiting = checks.filter((c) => c.code === undefined).map((c) => c.command);
  if (waiting.length > 0 && !stopped) console.log(`\nwaiting for the checks run beside ${program[0]}: ${waiting.join('; ')}`);
  await runChecks;

  for (const check of checks) {
    if (check.code === undefined) continue;
    console.log(`\n👾 beside ${program[0]} | ${check.command}`);
    process.stdout.write(Buffer.concat(check.output));
    console.log(`(${check.code === 0 ? 'passed' : `failed with exit code ${check.code}`} in ${check.seconds!.toFixed(1)} s)`);
  }
  if (programCode !== 0) return programCode;
  return checks.find((c) => c.code !== undefined && c.code !== 0)?.code ?? (stopped ? signalCode(stopped) : 0);
}

// process.exitCode, not process.exit(): the checks' output may still be on its way into a pipe.
main().then(
  (code) => {
    process.exitCode = code;
  },
  (e) => {
    console.error(e instanceof Error ? e.message : e);
    process.exit(2);
  },
);
