import { ChildProcess, spawn } from 'child_process';
import * as os from 'os';
import { parseArgs, ParseArgsConfig } from 'util';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SFNClient } from '@aws-sdk/client-sfn';
import { HolderStatus, SemaphoreClient, sleep, WaitState } from './semaphore-client';
import {
  isExecutionHolder,
  lockStripeName,
  MAX_CONCURRENCY_LIMIT,
  MAX_LOCK_STRIPES,
  MAX_OWNER_LENGTH,
  MAX_PERMITS,
  MAX_RATE_INTERVAL_SECONDS,
} from '../src/private/lock-schema';

/*
 * cdk-sfn-semaphore: flock for AWS. The same permits as the Step Functions workflows, for shell
 * scripts, CI jobs and operators. Exit codes as awsflock: 0 done, 3 not acquired / not the holder,
 * 2 usage, 1 any other error; every failure says why in one line on stderr.
 */

const NAME = 'cdk-sfn-semaphore';
export const EXIT = { ok: 0, error: 1, usage: 2, notAcquired: 3 } as const;
const TABLE_ENV = 'CDK_SFN_SEMAPHORE_TABLE';
const CLOCK_SKEW_ENV = 'CDK_SFN_SEMAPHORE_CLOCK_SKEW';
/** Shortest lease: `run` renews every third of it, and each renewal is a round trip to DynamoDB. */
const MIN_LEASE_SECONDS = 10;

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
  --clock-skew D    how long past its end a lease still counts as held, for clock differences
                    between machines; default: $${CLOCK_SKEW_ENV}, else 30s
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
  'acquire': `Usage: ${NAME} acquire LOCK [--stripes K] [--limit N] [--permits N] [--lease 15m] [--wait 60s | --no-wait]
                    [--owner NAME] [--rate-interval D] [--json]

Take a permit of LOCK and print its lease id. Without a renewal (see renew) the permit is free
again when the lease ends. An expired lease of someone else is reclaimed once it ended more than
the clock-skew margin ago (--clock-skew, default 30s). While it waits, it says so on stderr. On a
lock where executions queue, a waiting acquire goes next: it registers as the lock's collector, and
the permits given back then go to it rather than to the queue (one collector at a time). SIGINT,
SIGTERM, SIGHUP or SIGQUIT while it waits ends the wait (it gives its place up): exit 128 + its number.

  --limit N       the concurrency limit; default: the lock's limit, else 1. The lock's limit (the
                  workflows', stored on the lock) still applies: --limit can lower it, not raise it
  --permits N     how many of the lock's permits to take at once (a weight), 1 to 100 and at most
                  the limit; default 1. The release gives them all back
  --lease D       lease duration, at least 10s; default 15m
  --wait D        give up after D (exit 3); default: wait until a permit is free
  --no-wait       try once (exit 3 when the lock is full)
  --owner NAME    recorded with the permit; default: user@host
  --rate-interval D
                  the rate interval of the lock's workflows (1s to 1d, whole seconds), for a lock
                  that records none yet (no rate-limited execution has acquired it): recorded on
                  it, so that the release holds the permit for the interval, as an execution's
                  does. A lock that records an interval keeps it; default: the lock's, if any
  --stripes K     LOCK is split into K stripes (a workflow's lockStripes): take the permit of one of
                  LOCK#0 to LOCK#K-1, drawn at random, as the workflow's executions do, and print
                  that lock and the lease id on one line ("LOCK#3 LEASE_ID", the lease id last: it
                  has no space), as renew and release take them; default 1, LOCK
  --json          print {"lock", "leaseId", "fencingToken", "expiresAt"} instead of the lease id;
                  the fencing token strictly increases with every acquisition of the lock

${COMMON_HELP}`,
  'renew': `Usage: ${NAME} renew LOCK LEASE_ID [--lease 15m]

Extend the lease to D from now; prints its new end. Exit 3 when LEASE_ID holds no permit of LOCK
(any more: it was released, or reclaimed after it expired).

  --lease D       new lease duration from now, at least 10s; default 15m

${COMMON_HELP}`,
  'release': `Usage: ${NAME} release LOCK LEASE_ID

Give the permit back. Exit 3 when LEASE_ID holds no permit of LOCK. An execution's permit is
freed with force-release. On a lock whose workflows have a rate limit, it first waits until the
rate's interval has passed since the acquire (every acquisition, this one included, counts for it).

${COMMON_HELP}`,
  'run': `Usage: ${NAME} run LOCK [--stripes K] [--limit N] [--permits N] [--lease 15m] [--wait 60s | --no-wait]
                [--owner NAME] [--rate-interval D] -- COMMAND [ARGS...]

Take a permit, run COMMAND, renew the lease every third of its duration while COMMAND runs, and give
the permit back when it exits. Exits with COMMAND's exit code (128 + the signal number when a signal
ended it), or 3 when no permit was free within the wait. COMMAND finds the lease id in
$CDK_SFN_SEMAPHORE_LEASE_ID, the lock in $CDK_SFN_SEMAPHORE_LOCK, and the fencing token (it strictly
increases with every acquisition of the lock) in $CDK_SFN_SEMAPHORE_FENCING_TOKEN.

COMMAND runs in a process group (and session) of its own: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to
${NAME} (Ctrl-C and Ctrl-\\ in a terminal included) are passed to that whole group, once, children of
COMMAND included; the permit is given back once COMMAND has exited. COMMAND has no controlling
terminal (/dev/tty). A signal that arrives while waiting for a permit ends the wait: exit 128 + its
number. SIGKILL cannot be passed on: a ${NAME} killed with it leaves COMMAND running without
renewals, and once the lease has ended (plus the clock-skew margin) another holder may get in.

If a renewal finds the permit gone (force-released, or reclaimed after the lease expired), or renewals
keep failing until the lease has ended (it may be reclaimed), COMMAND's group gets SIGTERM, then
SIGKILL after min(10s, a third of the lease), and the exit code is 3. If giving the permit back fails
(after retries), ${NAME} warns and still exits with COMMAND's code: the lease then expires on its own.

  --stripes K     LOCK is split into K stripes (a workflow's lockStripes): take the permit of one of
                  LOCK#0 to LOCK#K-1, drawn at random, as the workflow's executions do; default 1, LOCK
  --limit, --permits, --lease, --wait, --no-wait, --owner, --rate-interval   as for acquire

${COMMON_HELP}`,
  'status': `Usage: ${NAME} status LOCK [--json]

Show the holders of LOCK (executions and leases), the permits each holds, their ages and leases, the permits in use, the
lock's limit and rate interval (every permit is held at least so long: the summary counts the permits
still inside their interval, and the RATE HOLD column says at least how much longer each is held), and
how many executions are queued for a permit (--json lists them).

  --json          print JSON instead of a table

${COMMON_HELP}`,
  'force-release': `Usage: ${NAME} force-release LOCK HOLDER --reason TEXT

Free the permit of any holder: a lease id, or an execution's ARN or holder id (as status shows it).
An execution keeps running: stop it first. The reason is printed with the release, for the log of
whoever runs it. Exit 3 when HOLDER holds no permit of LOCK.

  --reason TEXT   why (required)

${COMMON_HELP}`,
};

const COMMON_OPTIONS: ParseArgsConfig['options'] = {
  'table': { type: 'string' },
  'region': { type: 'string' },
  'profile': { type: 'string' },
  'clock-skew': { type: 'string' },
  'help': { type: 'boolean', short: 'h' },
};
const ACQUIRE_OPTIONS: ParseArgsConfig['options'] = {
  'limit': { type: 'string' },
  'permits': { type: 'string' },
  'lease': { type: 'string' },
  'wait': { type: 'string' },
  'no-wait': { type: 'boolean' },
  'owner': { type: 'string' },
  'rate-interval': { type: 'string' },
};
const COMMANDS: Record<string, { options: ParseArgsConfig['options']; positionals: string[] }> = {
  'acquire': { options: { ...ACQUIRE_OPTIONS, stripes: { type: 'string' }, json: { type: 'boolean' } }, positionals: ['LOCK'] },
  'renew': { options: { lease: { type: 'string' } }, positionals: ['LOCK', 'LEASE_ID'] },
  'release': { options: {}, positionals: ['LOCK', 'LEASE_ID'] },
  'run': { options: { ...ACQUIRE_OPTIONS, stripes: { type: 'string' } }, positionals: ['LOCK'] },
  'status': { options: { json: { type: 'boolean' } }, positionals: ['LOCK'] },
  'force-release': { options: { reason: { type: 'string' } }, positionals: ['LOCK', 'HOLDER'] },
};

type Values = Record<string, string | boolean | undefined>;

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
    io.stderr(`${NAME}: ${firstLine(e)}`);
    return EXIT.error;
  }
}

async function dispatch(argv: string[], io: CliIo): Promise<number> {
  const separator = argv.indexOf('--');
  const args = separator < 0 ? argv : argv.slice(0, separator);
  const command = separator < 0 ? [] : argv.slice(separator + 1);
  const [name, ...rest] = args;
  if (name === undefined) {
    io.stderr(HELP['']);
    return EXIT.usage;
  }
  if (name === '--help' || name === '-h' || name === 'help') {
    io.stdout(HELP['']);
    return EXIT.ok;
  }
  const spec = COMMANDS[name];
  if (!spec) throw new CliError(`unknown command '${name}' (acquire, renew, release, run, status, force-release; see --help)`, EXIT.usage);

  let parsed: { values: Values; positionals: string[] };
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

  const [named, second] = positionals;
  // acquire or run --stripes K: one of the stripes of a lock split by a workflow's lockStripes, drawn at random as its executions draw.
  const stripes = (name === 'acquire' || name === 'run') && values.stripes !== undefined ? stripesOption(name, values.stripes) : 1;
  const lock = stripes > 1 ? lockStripeName(named, Math.floor(Math.random() * stripes)) : named;
  if ((name === 'renew' || name === 'release') && isExecutionHolder(second)) {
    const why = name === 'renew' ? 'its permit lasts as long as it runs' : `free its permit with '${NAME} force-release LOCK HOLDER --reason TEXT' (stop it first)`;
    throw new CliError(`${name}: ${second} is an execution, not a lease: ${why}`, EXIT.usage);
  }
  const acquire = name === 'acquire' || name === 'run' ? acquireOptions(name, values, io.env) : undefined;
  const renewSeconds = name === 'renew' ? leaseOption(name, values.lease) : 0;
  const clockSkewSeconds =
    values['clock-skew'] !== undefined
      ? durationOption(name, '--clock-skew', values['clock-skew'], { zeroAllowed: true })
      : io.env[CLOCK_SKEW_ENV]
        ? durationOption(name, `$${CLOCK_SKEW_ENV}`, io.env[CLOCK_SKEW_ENV], { zeroAllowed: true })
        : undefined;

  const table = (values.table as string | undefined) ?? io.env[TABLE_ENV];
  if (!table) throw new CliError(`${name}: no table: pass --table NAME or set ${TABLE_ENV}`, EXIT.usage);

  // The SDK warns on stderr about Node versions it will drop one day: noise in every script's log.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  const sdk = { region: values.region as string | undefined, profile: values.profile as string | undefined };
  const client = new SemaphoreClient({
    tableName: table,
    clockSkewSeconds,
    dynamodb: new DynamoDBClient(sdk),
    // Releases wake the workflows' queued executions. One attempt: a retry of a call that did wake the
    // waiter would hear TaskTimedOut and take back the permit it uses.
    stepFunctions: new SFNClient({ ...sdk, maxAttempts: 1 }),
    onWarning: (message) => io.stderr(`${NAME}: ${lock}: warning: ${message}`),
  });

  switch (name) {
    case 'acquire': {
      const limits = limitReporter(lock, acquire!, io);
      // A signal ends the wait as run's does: a CLI waiting as the lock's collector gives its place up.
      const abort = new AbortController();
      let received: NodeJS.Signals | undefined;
      const onSignal = (signal: NodeJS.Signals) => {
        received ??= signal;
        abort.abort();
      };
      const signals = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'] as const;
      for (const signal of signals) process.on(signal, onSignal);
      let held: Awaited<ReturnType<SemaphoreClient['acquire']>>;
      try {
        held = await client.acquire(lock, { ...acquire!, signal: abort.signal, onWait: limits.onWait, onRetry: limits.onRetry });
      } finally {
        for (const signal of signals) process.off(signal, onSignal);
      }
      if (!held && received) {
        io.stderr(`${NAME}: ${lock}: interrupted (${received}) while waiting for a permit`);
        return exitCodeOf(received);
      }
      if (!held) throw await notAcquired(client, lock, acquire!, limits);
      limits.check(held.lockLimit);
      const printed = { lock, leaseId: held.leaseId, fencingToken: held.fencingToken, expiresAt: new Date(held.expiresAt).toISOString() };
      // With --stripes, the lock drawn too: renew and release name it.
      io.stdout(values.json ? JSON.stringify(printed) : values.stripes !== undefined ? `${lock} ${held.leaseId}` : held.leaseId);
      return EXIT.ok;
    }
    case 'renew': {
      const expiresAt = await client.renew(lock, second, renewSeconds);
      if (expiresAt === undefined) throw new CliError(`${lock}: ${second} holds no permit (released, or reclaimed after its lease expired)`, EXIT.notAcquired);
      io.stdout(new Date(expiresAt).toISOString());
      return EXIT.ok;
    }
    case 'release':
      if (!(await client.release(lock, second, { onRateHold: rateHoldNotice(lock, io) }))) throw new CliError(`${lock}: ${second} holds no permit`, EXIT.notAcquired);
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
      return run(client, lock, command, acquire!, io);
  }
  throw new CliError(`unknown command '${name}'`, EXIT.usage);
}

interface CliAcquireOptions {
  readonly limit?: number;
  readonly permits?: number;
  readonly leaseSeconds: number;
  readonly waitSeconds: number;
  /** As given, for messages. */
  readonly wait?: string;
  readonly owner: string;
  readonly rateIntervalSeconds?: number;
}

function acquireOptions(command: string, values: Values, env: NodeJS.ProcessEnv): CliAcquireOptions {
  if (values.wait !== undefined && values['no-wait']) throw new CliError(`${command}: --wait and --no-wait exclude each other`, EXIT.usage);
  let limit: number | undefined;
  if (values.limit !== undefined) {
    limit = /^\s*\d+\s*$/.test(String(values.limit)) ? Number(values.limit) : NaN;
    if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_CONCURRENCY_LIMIT) {
      throw new CliError(`${command}: --limit must be an integer from 1 to ${MAX_CONCURRENCY_LIMIT}, got: '${values.limit}'`, EXIT.usage);
    }
  }
  let permits: number | undefined;
  if (values.permits !== undefined) {
    permits = /^\s*\d+\s*$/.test(String(values.permits)) ? Number(values.permits) : NaN;
    if (!Number.isSafeInteger(permits) || permits < 1 || permits > MAX_PERMITS) {
      throw new CliError(`${command}: --permits must be an integer from 1 to ${MAX_PERMITS}, got: '${values.permits}'`, EXIT.usage);
    }
  }
  if (permits !== undefined && limit !== undefined && permits > limit) {
    throw new CliError(`${command}: --permits (${permits}) must be at most --limit (${limit})`, EXIT.usage);
  }
  return {
    limit,
    permits,
    leaseSeconds: leaseOption(command, values.lease),
    waitSeconds: values['no-wait'] ? 0 : values.wait === undefined ? Number.POSITIVE_INFINITY : durationOption(command, '--wait', values.wait, { zeroAllowed: true }),
    wait: values['no-wait'] ? undefined : ((values.wait as string | undefined) ?? 'forever'),
    owner: (values.owner as string | undefined) ?? defaultOwner(env),
    rateIntervalSeconds: values['rate-interval'] === undefined ? undefined : rateIntervalOption(command, values['rate-interval']),
  };
}

/** --stripes: an integer from 1 to MAX_LOCK_STRIPES, as a workflow's lockStripes. */
function stripesOption(name: string, value: string | boolean): number {
  const stripes = /^\s*\d+\s*$/.test(String(value)) ? Number(value) : NaN;
  if (!Number.isSafeInteger(stripes) || stripes < 1 || stripes > MAX_LOCK_STRIPES) {
    throw new CliError(`${name}: --stripes must be an integer from 1 to ${MAX_LOCK_STRIPES} (as a workflow's lockStripes), got: '${value}'`, EXIT.usage);
  }
  return stripes;
}

/** --rate-interval: whole seconds from 1 to a day, as a workflow's RateLimit. */
function rateIntervalOption(command: string, value: string | boolean): number {
  const seconds = durationOption(command, '--rate-interval', value, {});
  if (!Number.isInteger(seconds) || seconds > MAX_RATE_INTERVAL_SECONDS) {
    throw new CliError(`${command}: --rate-interval must be a whole number of seconds from 1s to 1d (as a workflow's rateLimit), got: '${value}'`, EXIT.usage);
  }
  return seconds;
}

/** user@host; the user from the environment (or the uid) where the system has no entry for it (containers). */
export function defaultOwner(env: NodeJS.ProcessEnv): string {
  let user: string | undefined;
  try {
    user = os.userInfo().username;
  } catch {
    user = env.USER || env.LOGNAME || `uid-${process.getuid?.() ?? 'unknown'}`;
  }
  // At most MAX_OWNER_LENGTH bytes, as the client requires (a long host name is cut).
  let owner = `${user}@${os.hostname()}`;
  while (Buffer.byteLength(owner, 'utf8') > MAX_OWNER_LENGTH) owner = owner.slice(0, -1);
  return owner;
}

/**
 * What an acquire reports on stderr besides failing: once, that it waits; once, that it goes next (with
 * the first or a later wait); once, that --limit is above the lock's limit (which then applies); each
 * attempt that failed and is tried again.
 */
function limitReporter(lock: string, options: CliAcquireOptions, io: CliIo) {
  let warned = false;
  let waiting = false;
  const check = (lockLimit: number | undefined) => {
    if (warned || options.limit === undefined || lockLimit === undefined || lockLimit >= options.limit) return;
    warned = true;
    io.stderr(`${NAME}: ${lock}: warning: the lock's limit is ${lockLimit}; --limit ${options.limit} cannot raise it`);
  };
  const onRetry = (error: Error) => io.stderr(`${NAME}: ${lock}: warning: acquiring failed (${firstLine(error)}), trying again`);
  let announcedNext = false;
  const onWait = (state: WaitState) => {
    check(state.lockLimit);
    // Once that it waits; once that it goes next, also when that comes after its first wait (executions queued later).
    const next = state.next && !announcedNext ? ', next in line (executions are queued: the permits given back go to it first)' : '';
    if (next) announcedNext = true;
    if (waiting) {
      if (next) io.stderr(`${NAME}: ${lock}: ${state.permitsInUse} of ${state.limit} permits in use, still waiting${next}`);
      return;
    }
    waiting = true;
    const until = options.wait === 'forever' ? 'until one is free' : `up to ${options.wait}`;
    io.stderr(`${NAME}: ${lock}: ${state.permitsInUse} of ${state.limit} permits in use, waiting ${until}${next}`);
  };
  return { check, onWait, onRetry };
}

async function notAcquired(
  client: SemaphoreClient,
  lock: string,
  options: CliAcquireOptions,
  limits: ReturnType<typeof limitReporter>,
): Promise<CliError> {
  const status = await client.status(lock);
  limits.check(status.limit);
  const limit = options.limit === undefined ? status.limit : Math.min(options.limit, status.limit ?? options.limit);
  const within = options.wait === undefined ? '' : ` within ${options.wait}`;
  return new CliError(`${lock}: no permit free${within} (${status.permitsInUse} of ${limit ?? '?'} held)`, EXIT.notAcquired);
}

/** Parse `90`, `90s`, `15m`, `2h`, `1d` into seconds. */
export function parseDuration(text: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)(s|m|h|d)?$/.exec(text.trim());
  if (!m) return undefined;
  const factor = { s: 1, m: 60, h: 3600, d: 86400 }[(m[2] ?? 's') as 's' | 'm' | 'h' | 'd'];
  return Number(m[1]) * factor;
}

function leaseOption(command: string, value: string | boolean | undefined): number {
  return durationOption(command, '--lease', value ?? '15m', { min: MIN_LEASE_SECONDS });
}

/** A duration option (or variable) in seconds; `what` names it in messages. */
function durationOption(command: string, what: string, value: string | boolean | undefined, limits: { zeroAllowed?: boolean; min?: number }): number {
  const text = String(value);
  if (/^\s*\d+(?:\.\d+)?\s*ms\s*$/.test(text)) {
    throw new CliError(`${command}: ${what} takes seconds, minutes, hours or days (90s, 15m, 2h, 1d), not milliseconds, got: '${text}'`, EXIT.usage);
  }
  const seconds = parseDuration(text);
  if (seconds === undefined || (limits.zeroAllowed ? seconds < 0 : seconds <= 0)) {
    throw new CliError(`${command}: ${what} must be a duration such as 90s, 15m or 2h${limits.zeroAllowed ? '' : ' (more than 0)'}, got: '${text}'`, EXIT.usage);
  }
  if (limits.min !== undefined && seconds < limits.min) {
    throw new CliError(`${command}: ${what} must be at least ${limits.min}s (it is renewed every third of it), got: '${text}'`, EXIT.usage);
  }
  return seconds;
}

async function printStatus(client: SemaphoreClient, lock: string, json: boolean, io: CliIo): Promise<number> {
  const status = await client.status(lock);
  if (json) {
    io.stdout(JSON.stringify(status, null, 2));
    return EXIT.ok;
  }
  const forRate = status.waitingForRate === undefined ? '' : ` (${status.waitingForRate} for the rate)`;
  const queued = status.waiting === 0 ? '' : `, ${status.waiting} execution${status.waiting === 1 ? '' : 's'} queued${forRate}`;
  const rate =
    status.rateIntervalSeconds === undefined
      ? ''
      : `, each held at least ${status.rateIntervalSeconds}s (the lock's rate), ${status.permitsHeldForRate} still inside that interval`;
  const slots = status.bodyLimit === undefined ? '' : `; ${status.bodiesRunning} of ${status.bodyLimit} body slots taken`;
  io.stdout(`${lock}: ${status.permitsInUse} of ${status.limit ?? '?'} permits in use${rate}${queued}${slots}`);
  if (status.holders.length === 0) return EXIT.ok;
  const withRate = status.rateIntervalSeconds !== undefined;
  const permits = (h: HolderStatus) => (h.collecting ? `${h.permits} (next: collecting)` : String(h.permits));
  const rows = status.holders.map((h) => [h.kind, h.id, permits(h), h.owner ?? '', age(h.ageSeconds), lease(h), ...(withRate ? [rateHold(h)] : [])]);
  const header = ['KIND', 'HOLDER', 'PERMITS', 'OWNER', 'AGE', 'LEASE', ...(withRate ? ['RATE HOLD'] : [])];
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((r) => r[i].length)));
  for (const row of [header, ...rows]) io.stdout(row.map((cell, i) => cell.padEnd(widths[i])).join('  ').trimEnd());
  return EXIT.ok;
}

function age(seconds: number): string {
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  return `${Math.floor(seconds / 3600)}h${Math.floor((seconds % 3600) / 60)}m`;
}

/**
 * At least how long the rate still holds a holder's permits, whatever its work does: an execution's
 * interval runs from its body's start (or its stop, or its failure), later than its acquire.
 */
function rateHold(h: HolderStatus): string {
  const left = Math.ceil((h.rateHoldEndsAt! - Date.now()) / 1000);
  return left > 0 ? `at least ${age(left)}` : 'interval passed';
}

function lease(h: HolderStatus): string {
  if (h.leaseExpiresAt !== undefined) {
    const left = Math.round((h.leaseExpiresAt - Date.now()) / 1000);
    return h.expired ? `expired ${age(-left)} ago` : left >= 0 ? `${age(left)} left` : `ended ${age(-left)} ago`;
  }
  return h.leaseSeconds !== undefined ? `${age(h.leaseSeconds)} (enforced by the reconciler)` : '-';
}

async function run(client: SemaphoreClient, lock: string, command: string[], options: CliAcquireOptions, io: CliIo): Promise<number> {
  // One handler for the whole run, so that no signal finds none: while waiting it ends the wait;
  // once the command runs it is passed on to its group; in between it keeps the command from starting.
  const abort = new AbortController();
  let child: ChildProcess | undefined;
  let received: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    received ??= signal;
    if (child) signalGroup(child, signal);
    else abort.abort();
  };
  const signals = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'] as const;
  for (const signal of signals) process.on(signal, onSignal);
  try {
    const limits = limitReporter(lock, options, io);
    const held = await client.acquire(lock, { ...options, signal: abort.signal, onWait: limits.onWait, onRetry: limits.onRetry });
    if (!held) {
      if (received) {
        io.stderr(`${NAME}: ${lock}: interrupted (${received}) while waiting for a permit`);
        return exitCodeOf(received);
      }
      throw await notAcquired(client, lock, options, limits);
    }
    limits.check(held.lockLimit);
    if (received) {
      await releaseWithRetries(client, lock, held.leaseId, held.expiresAt, io);
      return exitCodeOf(received);
    }

    // Its own process group (a session, in fact): a signal reaches the command and its children once,
    // from us, and stopping the group stops them all.
    // The command can pass the lease's fencing token on to systems that must reject a stale holder.
    const env = {
      ...process.env,
      CDK_SFN_SEMAPHORE_LEASE_ID: held.leaseId,
      CDK_SFN_SEMAPHORE_LOCK: lock,
      ...(held.fencingToken === undefined ? {} : { CDK_SFN_SEMAPHORE_FENCING_TOKEN: String(held.fencingToken) }),
    };
    const running = spawn(command[0], command.slice(1), { stdio: 'inherit', detached: true, env });
    child = running;
    const keeper = keepLease(client, lock, held.leaseId, held.expiresAt, options.leaseSeconds, running, io);
    const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>((resolve) => {
      running.once('error', (error) => resolve({ code: null, signal: null, error }));
      running.once('exit', (code, signal) => resolve({ code, signal }));
    });
    const lost = keeper.stop();
    const released = await releaseWithRetries(client, lock, held.leaseId, keeper.leaseEnd(), io);
    if (released === false && !lost) io.stderr(`${NAME}: ${lock}: ${held.leaseId} was no longer held when the command ended`);
    if (exit.error) throw new CliError(`run: cannot start '${command[0]}': ${exit.error.message}`, EXIT.error);
    if (lost) return EXIT.notAcquired;
    if (exit.signal) return exitCodeOf(exit.signal);
    return exit.code ?? EXIT.error;
  } finally {
    for (const signal of signals) process.off(signal, onSignal);
  }
}

/**
 * Renew the lease every third of its duration while `running` runs, one renewal at a time. The permit
 * is lost when a renewal finds it gone, or when renewals kept failing until the last confirmed end of
 * the lease (anyone may reclaim it then): the command's group then gets SIGTERM, and SIGKILL after a
 * grace period. `stop` (once the command has exited) ends the renewals, ignores any still under way,
 * kills what is left of the group of a command that lost its permit, and says whether it did.
 */
function keepLease(
  client: SemaphoreClient,
  lock: string,
  leaseId: string,
  expiresAt: number,
  leaseSeconds: number,
  running: ChildProcess,
  io: CliIo,
) {
  const everyMillis = (leaseSeconds * 1000) / 3;
  const graceMillis = Math.min(10_000, everyMillis);
  const stopped = new AbortController();
  let leaseEnd = expiresAt;
  let lost = false;
  let killTimer: NodeJS.Timeout | undefined;
  let deadline: NodeJS.Timeout | undefined;

  const lose = (why: string) => {
    if (lost || stopped.signal.aborted) return;
    lost = true;
    io.stderr(`${NAME}: ${lock}: ${why}: stopping the command (SIGTERM, then SIGKILL after ${Math.round(graceMillis / 100) / 10}s)`);
    signalGroup(running, 'SIGTERM');
    killTimer = setTimeout(() => signalGroup(running, 'SIGKILL'), graceMillis);
  };
  // Fires at the lease's end even while a renewal hangs; re-armed by each renewal (and in steps, as
  // timers do not take more than 2^31 - 1 ms).
  const armDeadline = () => {
    clearTimeout(deadline);
    const left = leaseEnd - Date.now();
    if (left <= 0) lose(`renewals of ${leaseId} failed until its lease ended at ${new Date(leaseEnd).toISOString()}, it may be reclaimed`);
    else deadline = setTimeout(armDeadline, Math.min(left, 2 ** 31 - 1));
  };
  armDeadline();

  void (async () => {
    let delay = everyMillis;
    while (!lost && !stopped.signal.aborted) {
      await sleep(delay, stopped.signal);
      if (lost || stopped.signal.aborted) return;
      try {
        const end = await client.renew(lock, leaseId, leaseSeconds);
        if (lost || stopped.signal.aborted) return;
        if (end === undefined) {
          lose(`the permit of ${leaseId} is gone (force-released, or reclaimed after its lease expired)`);
          return;
        }
        leaseEnd = end;
        armDeadline();
        delay = everyMillis;
      } catch (e) {
        if (lost || stopped.signal.aborted) return;
        io.stderr(`${NAME}: ${lock}: renewing ${leaseId} failed, retrying (the lease ends at ${new Date(leaseEnd).toISOString()}): ${firstLine(e)}`);
        delay = Math.min(everyMillis, 5000);
      }
    }
  })();

  return {
    leaseEnd: () => leaseEnd,
    stop: (): boolean => {
      stopped.abort();
      clearTimeout(deadline);
      clearTimeout(killTimer);
      if (lost && running.pid !== undefined) {
        try {
          process.kill(-running.pid, 'SIGKILL');
        } catch {
          // No one left in the group.
        }
      }
      return lost;
    },
  };
}

/** What a release says on stderr before it holds the permit for the lock's rate. */
function rateHoldNotice(lock: string, io: CliIo): (millis: number) => void {
  return (millis) => io.stderr(`${NAME}: ${lock}: holding the permit ${Math.ceil(millis / 1000)}s more: the lock's rate counts every acquisition for its interval`);
}

/** Give the permit back, retrying errors: true, false when it was not held, undefined when every attempt failed (then warns). */
async function releaseWithRetries(client: SemaphoreClient, lock: string, leaseId: string, leaseEnd: number, io: CliIo): Promise<boolean | undefined> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await client.release(lock, leaseId, { onRateHold: rateHoldNotice(lock, io) });
    } catch (e) {
      if (attempt === 4) {
        io.stderr(
          `${NAME}: ${lock}: warning: could not give the permit of ${leaseId} back (${firstLine(e)}); ` +
            `it is free again once its lease has ended, at ${new Date(leaseEnd).toISOString()} (plus the clock-skew margin)`,
        );
        return undefined;
      }
      await sleep(500 * 2 ** (attempt - 1));
    }
  }
}

/** Signal the process group of a command that still runs (or the command alone, should that fail). */
function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    child.kill(signal);
  }
}

function firstLine(e: unknown): string {
  const err = e as Error;
  return `${err.name && err.name !== 'Error' ? `${err.name}: ` : ''}${String(err.message).split('\n')[0]}`;
}

/** A shell's exit code for a process ended by `signal`: 128 + its number. */
function exitCodeOf(signal: NodeJS.Signals): number {
  return 128 + (os.constants.signals[signal] ?? 0);
}

if (require.main === module) {
  void main(process.argv.slice(2)).then((code) => process.exit(code));
}
