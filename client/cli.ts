import { ChildProcess, spawn } from 'child_process';
import * as os from 'os';
import { parseArgs, ParseArgsConfig } from 'util';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { HolderStatus, SemaphoreClient } from './semaphore-client';

/*
 * cdk-sfn-semaphore: flock for AWS. The same permits as the Step Functions workflows, for shell
 * scripts, CI jobs and operators. Exit codes as awsflock: 0 done, 3 not acquired / not the holder,
 * 2 usage, 1 any other error; every failure says why in one line on stderr.
 */

const NAME = 'cdk-sfn-semaphore';
export const EXIT = { ok: 0, error: 1, usage: 2, notAcquired: 3 } as const;
const TABLE_ENV = 'CDK_SFN_SEMAPHORE_TABLE';

class CliError extends Error {
  constructor(
    message: string,
    public readonly exitCode: number,
  ) {
    super(message);
  }
}

const COMMON_HELP = `Common options:
  --table NAME      the lock table (a SemaphoreTable); default: $${TABLE_ENV}
  --region REGION   AWS region; default: the SDK's (AWS_REGION, profile)
  --profile NAME    AWS profile; default: the SDK's (AWS_PROFILE)
  -h, --help        this help
The SDK's standard configuration applies, AWS_ENDPOINT_URL_DYNAMODB included.
Durations: 90 (seconds), 90s, 15m, 2h, 1d.`;

const HELP: Record<string, string> = {
  '': `Usage: ${NAME} COMMAND LOCK [options]

Take and give back permits of the locks that cdk-sfn-semaphore workflows use.

Commands:
  acquire LOCK        take a permit; prints the lease id
  renew LOCK LEASE    extend a lease
  release LOCK LEASE  give a permit back
  run LOCK -- CMD...  hold a permit while a command runs
  status LOCK         holders, ages, leases, count and limit
  force-release LOCK HOLDER --reason TEXT
                      free anyone's permit (operators)

Exit codes: 0 done, 3 not acquired within the wait or not the holder, 2 usage, 1 other errors.
Run '${NAME} COMMAND --help' for a command's options.

${COMMON_HELP}`,
  'acquire': `Usage: ${NAME} acquire LOCK [--limit N] [--lease 15m] [--wait 60s | --no-wait] [--owner NAME]

Take a permit of LOCK and print its lease id. Without a renewal (see renew) the permit is free
again when the lease ends. An expired lease of someone else is reclaimed once it ended more than
30 s ago (clock skew).

  --limit N       the concurrency limit; default: the limit of the lock's last acquire, else 1
  --lease D       lease duration; default 15m
  --wait D        give up after D (exit 3); default: wait until a permit is free
  --no-wait       try once (exit 3 when the lock is full)
  --owner NAME    recorded with the permit; default: user@host

${COMMON_HELP}`,
  'renew': `Usage: ${NAME} renew LOCK LEASE_ID [--lease 15m]

Extend the lease to D from now; prints its new end. Exit 3 when LEASE_ID holds no permit of LOCK
(any more: it was released, or reclaimed after it expired).

  --lease D       new lease duration from now; default 15m

${COMMON_HELP}`,
  'release': `Usage: ${NAME} release LOCK LEASE_ID

Give the permit back. Exit 3 when LEASE_ID holds no permit of LOCK.

${COMMON_HELP}`,
  'run': `Usage: ${NAME} run LOCK [--limit N] [--lease 15m] [--wait 60s | --no-wait] [--owner NAME] -- COMMAND [ARGS...]

Take a permit, run COMMAND, renew the lease every third of its duration while COMMAND runs, and give
the permit back when it exits. SIGINT and SIGTERM are passed to COMMAND; the permit is given back once
it has exited. Exits with COMMAND's exit code (128 + the signal number when a signal ended it), or 3
when no permit was free within the wait. If a renewal finds the permit gone, COMMAND gets SIGTERM and
the exit code is 3.

${COMMON_HELP}`,
  'status': `Usage: ${NAME} status LOCK [--json]

Show the holders of LOCK (executions and leases), their ages and leases, the permits in use and the
limit of the last acquire.

  --json          print JSON instead of a table

${COMMON_HELP}`,
  'force-release': `Usage: ${NAME} force-release LOCK HOLDER --reason TEXT

Free the permit of any holder: a lease id or an execution ARN. An execution keeps running: stop it
first. The reason is printed with the release, for the log of whoever runs it. Exit 3 when HOLDER
holds no permit of LOCK.

  --reason TEXT   why (required)

${COMMON_HELP}`,
};

const COMMON_OPTIONS: ParseArgsConfig['options'] = {
  table: { type: 'string' },
  region: { type: 'string' },
  profile: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};
const ACQUIRE_OPTIONS: ParseArgsConfig['options'] = {
  'limit': { type: 'string' },
  'lease': { type: 'string' },
  'wait': { type: 'string' },
  'no-wait': { type: 'boolean' },
  'owner': { type: 'string' },
};
const COMMANDS: Record<string, { options: ParseArgsConfig['options']; positionals: string[] }> = {
  'acquire': { options: ACQUIRE_OPTIONS, positionals: ['LOCK'] },
  'renew': { options: { lease: { type: 'string' } }, positionals: ['LOCK', 'LEASE_ID'] },
  'release': { options: {}, positionals: ['LOCK', 'LEASE_ID'] },
  'run': { options: ACQUIRE_OPTIONS, positionals: ['LOCK'] },
  'status': { options: { json: { type: 'boolean' } }, positionals: ['LOCK'] },
  'force-release': { options: { reason: { type: 'string' } }, positionals: ['LOCK', 'HOLDER'] },
};

/** Where the CLI writes, and how it ends: injectable for tests. */
export interface CliIo {
  readonly stdout: (line: string) => void;
  readonly stderr: (line: string) => void;
  readonly env: NodeJS.ProcessEnv;
}

const processIo: CliIo = {
  stdout: (line) => process.stdout.write(`${line}\n`),
  stderr: (line) => process.stderr.write(`${line}\n`),
  env: process.env,
};

/** Run the CLI with `argv` (without node and the script); resolves to the exit code. */
export async function main(argv: string[], io: CliIo = processIo): Promise<number> {
  try {
    return await dispatch(argv, io);
  } catch (e) {
    if (e instanceof CliError) {
      io.stderr(`${NAME}: ${e.message}`);
      return e.exitCode;
    }
    const err = e as Error;
    io.stderr(`${NAME}: ${err.name && err.name !== 'Error' ? `${err.name}: ` : ''}${err.message.split('\n')[0]}`);
    return EXIT.error;
  }
}

async function dispatch(argv: string[], io: CliIo): Promise<number> {
  const separator = argv.indexOf('--');
  const args = separator < 0 ? argv : argv.slice(0, separator);
  const command = separator < 0 ? [] : argv.slice(separator + 1);
  const [name, ...rest] = args;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    io.stdout(HELP['']);
    return name === undefined ? EXIT.usage : EXIT.ok;
  }
  const spec = COMMANDS[name];
  if (!spec) throw new CliError(`unknown command '${name}' (acquire, renew, release, run, status, force-release; see --help)`, EXIT.usage);

  let parsed: { values: Record<string, string | boolean | undefined>; positionals: string[] };
  try {
    parsed = parseArgs({ args: rest, options: { ...COMMON_OPTIONS, ...spec.options }, allowPositionals: true, strict: true }) as typeof parsed;
  } catch (e) {
    throw new CliError(`${name}: ${(e as Error).message.split('\n')[0]}`, EXIT.usage);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    io.stdout(HELP[name]);
    return EXIT.ok;
  }
  if (positionals.length !== spec.positionals.length) {
    throw new CliError(`${name}: expected ${spec.positionals.join(' ')}, got ${positionals.length === 0 ? 'nothing' : positionals.join(' ')} (see ${NAME} ${name} --help)`, EXIT.usage);
  }
  if (name === 'run' && command.length === 0) throw new CliError(`run: no command after '--' (see ${NAME} run --help)`, EXIT.usage);
  if (name !== 'run' && command.length > 0) throw new CliError(`${name}: unexpected '-- ${command.join(' ')}'`, EXIT.usage);

  const table = (values.table as string | undefined) ?? io.env[TABLE_ENV];
  if (!table) throw new CliError(`${name}: no table: pass --table NAME or set ${TABLE_ENV}`, EXIT.usage);
  const client = new SemaphoreClient({
    tableName: table,
    dynamodb: new DynamoDBClient({ region: values.region as string | undefined, profile: values.profile as string | undefined }),
  });
  const [lock, second] = positionals;

  switch (name) {
    case 'acquire': {
      const held = await client.acquire(lock, acquireOptions(name, values));
      if (!held) throw await notAcquired(client, lock, values);
      io.stdout(held.leaseId);
      return EXIT.ok;
    }
    case 'renew': {
      const expiresAt = await client.renew(lock, second, durationOption(name, 'lease', values.lease, 900));
      if (expiresAt === undefined) throw new CliError(`${lock}: ${second} holds no permit (released, or reclaimed after its lease expired)`, EXIT.notAcquired);
      io.stdout(new Date(expiresAt).toISOString());
      return EXIT.ok;
    }
    case 'release':
      if (!(await client.release(lock, second))) throw new CliError(`${lock}: ${second} holds no permit`, EXIT.notAcquired);
      return EXIT.ok;
    case 'force-release': {
      const reason = values.reason as string | undefined;
      if (!reason) throw new CliError('force-release: --reason TEXT is required', EXIT.usage);
      if (!(await client.forceRelease(lock, second))) throw new CliError(`${lock}: ${second} holds no permit`, EXIT.notAcquired);
      io.stderr(`${NAME}: ${lock}: released ${second} by force: ${reason}`);
      return EXIT.ok;
    }
    case 'status':
      return printStatus(client, lock, values.json === true, io);
    case 'run':
      return run(client, lock, command, values, io);
  }
  throw new CliError(`unknown command '${name}'`, EXIT.usage);
}

function acquireOptions(command: string, values: Record<string, string | boolean | undefined>) {
  if (values.wait !== undefined && values['no-wait']) throw new CliError(`${command}: --wait and --no-wait exclude each other`, EXIT.usage);
  let limit: number | undefined;
  if (values.limit !== undefined) {
    limit = Number(values.limit);
    if (!Number.isInteger(limit) || limit < 1) throw new CliError(`${command}: --limit must be a positive integer, got: '${values.limit}'`, EXIT.usage);
  }
  return {
    limit,
    leaseSeconds: durationOption(command, 'lease', values.lease, 900),
    waitSeconds: values['no-wait'] ? 0 : values.wait === undefined ? Number.POSITIVE_INFINITY : durationOption(command, 'wait', values.wait, 0, true),
    owner: (values.owner as string | undefined) ?? `${os.userInfo().username}@${os.hostname()}`,
  };
}

async function notAcquired(client: SemaphoreClient, lock: string, values: Record<string, string | boolean | undefined>): Promise<CliError> {
  const status = await client.status(lock);
  const within = values['no-wait'] ? '' : ` within ${values.wait}`;
  return new CliError(`${lock}: no permit free${within} (${status.permitsInUse} of ${status.limit ?? '?'} held)`, EXIT.notAcquired);
}

/** Parse `90`, `90s`, `15m`, `2h`, `1d` into seconds. */
export function parseDuration(text: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(text.trim());
  if (!m) return undefined;
  const factor = { ms: 0.001, s: 1, m: 60, h: 3600, d: 86400 }[(m[2] ?? 's') as 'ms' | 's' | 'm' | 'h' | 'd'];
  return Number(m[1]) * factor;
}

function durationOption(command: string, option: string, value: string | boolean | undefined, fallback: number, zeroAllowed = false): number {
  if (value === undefined) return fallback;
  const seconds = parseDuration(String(value));
  if (seconds === undefined || (zeroAllowed ? seconds < 0 : seconds <= 0)) {
    throw new CliError(`${command}: --${option} must be a duration such as 90s, 15m or 2h${zeroAllowed ? '' : ' (more than 0)'}, got: '${value}'`, EXIT.usage);
  }
  return seconds;
}

async function printStatus(client: SemaphoreClient, lock: string, json: boolean, io: CliIo): Promise<number> {
  const status = await client.status(lock);
  if (json) {
    io.stdout(JSON.stringify(status, null, 2));
    return EXIT.ok;
  }
  io.stdout(`${lock}: ${status.permitsInUse} of ${status.limit ?? '?'} permits in use`);
  if (status.holders.length === 0) return EXIT.ok;
  const rows = status.holders.map((h) => [h.kind, h.id, h.owner ?? '', age(h.ageSeconds), lease(h)]);
  const header = ['KIND', 'HOLDER', 'OWNER', 'AGE', 'LEASE'];
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((r) => r[i].length)));
  for (const row of [header, ...rows]) io.stdout(row.map((cell, i) => cell.padEnd(widths[i])).join('  ').trimEnd());
  return EXIT.ok;
}

function age(seconds: number): string {
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  return `${Math.floor(seconds / 3600)}h${Math.floor((seconds % 3600) / 60)}m`;
}

function lease(h: HolderStatus): string {
  if (h.leaseExpiresAt !== undefined) {
    const left = Math.round((h.leaseExpiresAt - Date.now()) / 1000);
    return h.expired ? `expired ${age(-left)} ago` : left >= 0 ? `${age(left)} left` : `ended ${age(-left)} ago`;
  }
  return h.leaseSeconds !== undefined ? `${age(h.leaseSeconds)} (enforced by the reconciler)` : '-';
}

type Values = Record<string, string | boolean | undefined>;

async function run(client: SemaphoreClient, lock: string, command: string[], values: Values, io: CliIo): Promise<number> {
  const options = acquireOptions('run', values);
  // One handler for the whole run, so that no signal finds none: while waiting it ends the wait;
  // once the command runs it is passed on; in between it keeps the command from starting.
  const abort = new AbortController();
  let child: ChildProcess | undefined;
  let received: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    received ??= signal;
    if (child) child.kill(signal);
    else abort.abort();
  };
  const signals = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
  for (const signal of signals) process.on(signal, onSignal);
  try {
    const held = await client.acquire(lock, { ...options, signal: abort.signal });
    if (!held) {
      if (received) throw new CliError(`${lock}: interrupted (${received}) while waiting for a permit`, EXIT.notAcquired);
      throw await notAcquired(client, lock, values);
    }
    if (received) {
      await client.release(lock, held.leaseId);
      return exitCodeOf(received);
    }

    let lost = false;
    const running = spawn(command[0], command.slice(1), { stdio: 'inherit' });
    child = running;
    const renewal = setInterval(() => {
      client.renew(lock, held.leaseId, options.leaseSeconds).then(
        (expiresAt) => {
          if (expiresAt === undefined && !lost) {
            lost = true;
            io.stderr(`${NAME}: ${lock}: the permit of ${held.leaseId} is gone (reclaimed after its lease expired?): stopping the command`);
            running.kill('SIGTERM');
          }
        },
        (e: Error) => io.stderr(`${NAME}: ${lock}: renewing ${held.leaseId} failed, will retry: ${e.message.split('\n')[0]}`),
      );
    }, Math.max(1000, (options.leaseSeconds * 1000) / 3));

    const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>((resolve) => {
      running.once('error', (error) => resolve({ code: null, signal: null, error }));
      running.once('exit', (code, signal) => resolve({ code, signal }));
    });
    clearInterval(renewal);
    const released = await client.release(lock, held.leaseId);
    if (!released && !lost) io.stderr(`${NAME}: ${lock}: ${held.leaseId} was no longer held when the command ended`);
    if (exit.error) throw new CliError(`run: cannot start '${command[0]}': ${exit.error.message}`, EXIT.error);
    if (lost) return EXIT.notAcquired;
    if (exit.signal) return exitCodeOf(exit.signal);
    return exit.code ?? EXIT.error;
  } finally {
    for (const signal of signals) process.off(signal, onSignal);
  }
}

/** A shell's exit code for a process ended by `signal`: 128 + its number. */
function exitCodeOf(signal: NodeJS.Signals): number {
  return 128 + (os.constants.signals[signal] ?? 0);
}

if (require.main === module) {
  void main(process.argv.slice(2)).then((code) => process.exit(code));
}
