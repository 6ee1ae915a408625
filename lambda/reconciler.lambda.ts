import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DescribeExecutionCommand, GetExecutionHistoryCommand, HistoryEvent, SFNClient, StopExecutionCommand } from '@aws-sdk/client-sfn';
import { DynamoDBDocumentClient, ScanCommand, ScanCommandOutput, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { dropWaiter, serveQueue } from '../client/queue-service';
import {
  ACQUIRE_CONDITION,
  ACQUIRE_UPDATE,
  CONCURRENCY_LIMIT,
  FENCING_TOKEN,
  HOLDER_ACQUIRED_AT,
  HOLDER_LEASE_EXPIRES_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  isExecutionHolder,
  LOCK_KEY,
  NAMES,
  PERMITS_IN_USE,
  RELEASE_CONDITION,
  RELEASE_EXPIRED_LEASE_CONDITION,
  RELEASE_SEEN_HOLDER_CONDITION,
  RELEASE_TAKEN_BEFORE_CONDITION,
  RELEASE_UPDATE,
  RENEW_UPDATE,
  VALUES,
  WAITERS,
} from '../src/private/lock-schema';
import { BEFORE_BODY_STATES, OUTSIDE_BODY_STATES } from '../src/private/state-names';

/*
 * The reconciler: the third layer of cleanup. EventBridge delivers Step Functions status-change events
 * "best effort", a cleanup can fail, and an acquire can land after its execution was stopped (after
 * the cleanup ran). Each of these leaves a permit held by nobody alive. The reconciler sweeps the lock
 * table and, for every holder:
 *
 * - an execution of a protected state machine that is not RUNNING (or does not exist) is released
 *   with the same conditional write as the cleanup;
 * - a RUNNING execution past its lease is stopped (SemaphoreLeaseExpired) and only then released, so
 *   that two holders never overlap;
 * - a holder that is not an execution (a script's lease) is released once its lease has expired,
 *   conditional on the lease not having been renewed meanwhile.
 *
 * Safe while executions acquire and release concurrently: every write is conditional on the holder
 * entry it read, and a RUNNING execution within its lease is never touched. A failure on one holder
 * is counted and the sweep goes on. The sweep stops early, and says so, when the function is about to
 * run out of time.
 */

/**
 * What the function may be invoked with: a scheduled event, `{}` (or `{ dryRun: true }`) on demand,
 * or the status-change event of a redriven execution (the redrive guard).
 */
export interface ReconcilerEvent {
  /** Report what would be released, change nothing. */
  readonly 'dryRun'?: boolean;
  readonly 'detail-type'?: string;
  readonly 'detail'?: StatusChangeDetail;
}

/** The fields of a "Step Functions Execution Status Change" event the redrive guard reads. */
export interface StatusChangeDetail {
  readonly executionArn: string;
  readonly status: string;
  readonly redriveCount?: number;
  readonly input?: string | null;
}

/** What the redrive guard did. */
export interface RedriveGuardResult {
  readonly executionArn: string;
  /** The state the execution resumed at. */
  readonly resumedAt?: string;
  readonly action:
    | 'not ours'
    | 'no longer running'
    | 'outside the body'
    | 'stale permit released'
    | 'permit taken again'
    | 'permit taken again, then given back'
    | 'still holds its permit'
    | 'stopped';
}

/** A permit the sweep released (or, in a dry run, would release). */
export interface Reclaimed {
  readonly lockName: string;
  readonly holder: string;
  readonly reason: string;
}

/** What one sweep did. */
export interface ReconcilerResult {
  locks: number;
  holders: number;
  reclaimed: Reclaimed[];
  /** Executions stopped because their lease expired. */
  stopped: string[];
  /** Queue entries dropped (of stopped waiters, or of waiters that hold a permit already). */
  waitersRemoved: number;
  /** Waiters handed a permit that was free (freed by this sweep, or otherwise) and woken. */
  waitersAdmitted: number;
  errors: Array<{ lockName: string; holder: string; error: string }>;
  /** True if the sweep stopped early for lack of time; the next one continues. */
  truncated: boolean;
  dryRun: boolean;
}

interface Context {
  getRemainingTimeInMillis(): number;
}

/** Statuses of an execution that will never give its permit back itself (a missing one counts too). */
const RELEASABLE_STATUSES = ['SUCCEEDED', 'FAILED', 'TIMED_OUT', 'ABORTED', 'DOES_NOT_EXIST'];

/** Leave this much time for the last holder and the metrics. */
const TIME_MARGIN_MS = 10_000;
/** At most this many holders are checked at once (DescribeExecution is rate-limited per account). */
const PARALLELISM = 4;
/** A lease counts as expired only this long after its end, to absorb clock skew between machines. */
const CLOCK_SKEW_MS = Number(process.env.CLOCK_SKEW_SECONDS ?? '30') * 1000;

const dynamodb = new DynamoDBClient({});
const ddb = DynamoDBDocumentClient.from(dynamodb);
const sfn = new SFNClient({});
// Wake-ups get one attempt: a retried SendTaskSuccess that did wake the waiter hears TaskTimedOut and
// would give back the permit the waiter is using. A failed one is a lost wake-up the waiter recovers.
const wakeClient = new SFNClient({ maxAttempts: 1 });

export async function handler(event: ReconcilerEvent = {}, context?: Context): Promise<ReconcilerResult | RedriveGuardResult> {
  if (event['detail-type'] === 'Step Functions Execution Status Change' && event.detail) {
    return guardRedrive(event.detail);
  }
  return sweep(event, context);
}

/** Executions of these state machines are ours to describe, stop and release. */
function executionPrefixes(): string[] {
  return (process.env.STATE_MACHINE_ARNS ?? '')
    .split(',')
    .filter((arn) => arn !== '')
    .map((arn) => `${arn.replace(':stateMachine:', ':execution:')}:`);
}

async function sweep(event: ReconcilerEvent, context?: Context): Promise<ReconcilerResult> {
  const table = requiredEnv('TABLE_NAME');
  const prefixes = executionPrefixes();
  const dryRun = event.dryRun === true;
  const outOfTime = () => context !== undefined && context.getRemainingTimeInMillis() < TIME_MARGIN_MS;

  const result: ReconcilerResult = {
    locks: 0,
    holders: 0,
    reclaimed: [],
    stopped: [],
    waitersRemoved: 0,
    waitersAdmitted: 0,
    errors: [],
    truncated: false,
    dryRun,
  };
  const permitsInUse = new Map<string, number>();
  try {
    await reconcilePages(table, prefixes, dryRun, outOfTime, result, permitsInUse);
  } finally {
    // Even when the sweep fails part-way (a Scan error, a timeout), what it reclaimed is counted.
    emitMetrics(table, permitsInUse, result);
  }
  return result;
}

/** Page through the lock table and reconcile every holder of every lock, until done or out of time. */
async function reconcilePages(
  table: string,
  prefixes: string[],
  dryRun: boolean,
  outOfTime: () => boolean,
  result: ReconcilerResult,
  permitsInUse: Map<string, number>,
): Promise<void> {
  let startKey: Record<string, unknown> | undefined;
  scan: do {
    const page: ScanCommandOutput = await ddb.send(new ScanCommand({ TableName: table, ConsistentRead: true, ExclusiveStartKey: startKey }));
    for (const item of page.Items ?? []) {
      if (outOfTime()) {
        result.truncated = true;
        break scan;
      }
      const lockName = String(item[LOCK_KEY]);
      result.locks++;
      let held = Number(item[PERMITS_IN_USE] ?? 0);
      const holders = Object.entries(item).filter(([, v]) => isHolderEntry(v));
      result.holders += holders.length;
      const queue = [...holders];
      const worker = async () => {
        for (let next = queue.shift(); next; next = queue.shift()) {
          // A lock can have thousands of holders: the time bound holds inside one lock too.
          if (outOfTime()) {
            result.truncated = true;
            return;
          }
          const [holder, entry] = next;
          try {
            const reason = await reconcileHolder(table, lockName, holder, entry as HolderEntry, prefixes, dryRun, result);
            if (reason !== undefined) {
              result.reclaimed.push({ lockName, holder, reason });
              if (!dryRun) held--;
            }
          } catch (e) {
            result.errors.push({ lockName, holder, error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) });
          }
        }
      };
      await Promise.all(Array.from({ length: PARALLELISM }, worker));
      permitsInUse.set(lockName, held);
      const waiters = item[WAITERS];
      if (!dryRun && Array.isArray(waiters) && waiters.length > 0 && !outOfTime()) {
        try {
          await serveWaiters(table, lockName, prefixes, result);
        } catch (e) {
          result.errors.push({ lockName, holder: WAITERS, error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) });
        }
      }
    }
    startKey = page.LastEvaluatedKey;
  } while (startKey);
}

/**
 * A queue with waiters: drop the entries of waiters that stopped (only executions of our state
 * machines are described; others are left to their releasers), and hand every free permit to the
 * oldest waiter, as a release would. A permit freed by this sweep, or by an acquire undone after a
 * server error, would otherwise sit free while the waiters sleep until their check interval.
 */
async function serveWaiters(table: string, lockName: string, prefixes: string[], result: ReconcilerResult): Promise<void> {
  const served = await serveQueue(
    {
      dynamodb,
      stepFunctions: wakeClient,
      tableName: table,
      isGone: async (executionArn) => {
        if (!prefixes.some((prefix) => executionArn.startsWith(prefix))) return false;
        return RELEASABLE_STATUSES.includes(await executionStatus(executionArn));
      },
    },
    lockName,
  );
  result.waitersRemoved += served.removed;
  result.waitersAdmitted += served.admitted;
}

/** The execution's status, DOES_NOT_EXIST for one that does not exist. */
async function executionStatus(executionArn: string): Promise<string> {
  try {
    return (await sfn.send(new DescribeExecutionCommand({ executionArn }))).status ?? 'UNKNOWN';
  } catch (e) {
    if ((e as Error).name !== 'ExecutionDoesNotExist') throw e;
    return 'DOES_NOT_EXIST';
  }
}

interface HolderEntry {
  readonly [HOLDER_ACQUIRED_AT]: string;
  readonly [HOLDER_LEASE_SECONDS]?: number;
  readonly [HOLDER_LEASE_EXPIRES_AT]?: number;
}

function isHolderEntry(value: unknown): boolean {
  return typeof value === 'object' && value !== null && typeof (value as Record<string, unknown>)[HOLDER_ACQUIRED_AT] === 'string';
}

/** Decide about one holder; release it if it must go. Returns why it was released, or undefined. */
async function reconcileHolder(
  table: string,
  lockName: string,
  holder: string,
  entry: HolderEntry,
  ownPrefixes: string[],
  dryRun: boolean,
  result: ReconcilerResult,
): Promise<string | undefined> {
  const now = Date.now();
  if (!isExecutionHolder(holder)) {
    const expiresAt = entry[HOLDER_LEASE_EXPIRES_AT];
    if (expiresAt === undefined || now <= expiresAt + CLOCK_SKEW_MS) {
      return undefined;
    }
    if (!dryRun && !(await release(table, lockName, holder, { leaseExpiresAt: expiresAt }))) return undefined;
    return `lease expired at ${new Date(expiresAt).toISOString()}`;
  }

  if (!ownPrefixes.some((prefix) => holder.startsWith(prefix))) {
    // Another state machine's execution: its own reconciler, with its own permissions, sweeps it.
    return undefined;
  }
  const status = await executionStatus(holder);
  if (!RELEASABLE_STATUSES.includes(status)) {
    if (status !== 'RUNNING') return undefined; // PENDING_REDRIVE, or a status this code does not know: leave it
  } else {
    if (!dryRun && !(await release(table, lockName, holder, { acquiredAt: entry[HOLDER_ACQUIRED_AT] }))) return undefined;
    return `execution ${status}`;
  }

  const leaseSeconds = entry[HOLDER_LEASE_SECONDS];
  // 0 is no lease (an entry handed off from the queue always carries the field).
  if (leaseSeconds === undefined || !(leaseSeconds > 0)) return undefined;
  const leaseEnd = Date.parse(entry[HOLDER_ACQUIRED_AT]) + leaseSeconds * 1000;
  // An entry this code cannot read is never a reason to stop a running execution.
  if (!Number.isFinite(leaseEnd) || now <= leaseEnd) return undefined;
  if (dryRun) return `lease of ${leaseSeconds} s expired at ${new Date(leaseEnd).toISOString()}`;
  // Stop first, release after: the permit is never free while its execution still runs.
  await sfn.send(
    new StopExecutionCommand({
      executionArn: holder,
      error: 'SemaphoreLeaseExpired',
      cause: `Held a permit of lock '${lockName}' for more than its lease of ${leaseSeconds} s (since ${entry[HOLDER_ACQUIRED_AT]})`,
    }),
  );
  result.stopped.push(holder);
  if (!(await release(table, lockName, holder, { acquiredAt: entry[HOLDER_ACQUIRED_AT] }))) return undefined;
  return `lease of ${leaseSeconds} s expired at ${new Date(leaseEnd).toISOString()}; execution stopped`;
}

/**
 * The cleanup's conditional release, further conditional on the entry the sweep read: its lease end
 * (a script may renew it) or its acquire time (a redriven execution takes a new entry under the same
 * name). False if the holder was gone or changed meanwhile: nothing to do.
 */
async function release(
  table: string,
  lockName: string,
  holder: string,
  seen: { readonly leaseExpiresAt: number } | { readonly acquiredAt: string },
): Promise<boolean> {
  const [condition, values] =
    'leaseExpiresAt' in seen
      ? [RELEASE_EXPIRED_LEASE_CONDITION, { [VALUES.expiresAt]: seen.leaseExpiresAt }]
      : [RELEASE_SEEN_HOLDER_CONDITION, { [VALUES.acquiredAt]: seen.acquiredAt }];
  return conditionalUpdate(table, lockName, holder, RELEASE_UPDATE, condition, { [VALUES.one]: 1, ...values });
}

/**
 * The redrive guard. `RedriveExecution` resumes an execution at the state where it stopped; stopped
 * inside the body, it resumes inside the body, and its permit was freed by the cleanup meanwhile. On
 * its RUNNING status-change event, if it still runs: take a permit for it again; if every permit is
 * taken, stop it (error `SemaphoreRedriveRejected`). Redriven before the body, it takes its own, and
 * an entry left from before the redrive is freed. Redriven after the body, it gives back its own.
 */
async function guardRedrive(detail: StatusChangeDetail): Promise<RedriveGuardResult> {
  const executionArn = detail.executionArn;
  if (!executionPrefixes().some((prefix) => executionArn.startsWith(prefix))) {
    return { executionArn, action: 'not ours' };
  }
  // The event may be late: act only on an execution that still runs.
  const described = await sfn.send(new DescribeExecutionCommand({ executionArn }));
  if (described.status !== 'RUNNING') {
    return { executionArn, action: 'no longer running' };
  }
  const resumed = await resumedState(executionArn);
  const resumedAt = resumed?.state;
  const input = JSON.parse(detail.input ?? described.input ?? '{}');
  const lockName = String(fromEnvOrInput('LOCK_NAME', input));
  const limit = Number(fromEnvOrInput('CONCURRENCY_LIMIT', input));
  const table = requiredEnv('TABLE_NAME');
  if (resumed !== undefined && BEFORE_BODY_STATES.includes(resumed.state)) {
    // It will take its own permit; an entry from before the redrive (an acquire that landed after its
    // stop) would make that acquire fail on its own name, forever. Free it.
    const freed = await conditionalUpdate(table, lockName, executionArn, RELEASE_UPDATE, RELEASE_TAKEN_BEFORE_CONDITION, {
      [VALUES.one]: 1,
      [VALUES.acquiredAt]: resumed.redrivenAt,
    });
    // A queue entry of the run before would be renewed in place by this run, and carry that run's
    // count into the permit handed to it, where a late cleanup of that run could free it. It queues anew.
    const run = described.redriveCount ?? detail.redriveCount ?? 1;
    await dropWaiter({ dynamodb, stepFunctions: wakeClient, tableName: table }, lockName, executionArn, run);
    return { executionArn, resumedAt, action: freed ? 'stale permit released' : 'outside the body' };
  }
  if (resumedAt === undefined || OUTSIDE_BODY_STATES.includes(resumedAt)) {
    return { executionArn, resumedAt, action: 'outside the body' };
  }
  const leaseSeconds = process.env.LEASE_SECONDS ? Number(process.env.LEASE_SECONDS) : undefined;
  // The run the entry belongs to, so that a late cleanup of the run before the redrive leaves it.
  const redriveCount = described.redriveCount ?? detail.redriveCount ?? 1;
  // Take a permit again; if it still holds one (its cleanup never ran), renew the entry instead, so
  // that a sweep that judged the old entry dead leaves it alone. A release between the two tries
  // makes the acquire worth another go.
  for (let attempt = 0; attempt < 3; attempt++) {
    const now = new Date().toISOString();
    if (await conditionalUpdate(table, lockName, executionArn, ACQUIRE_UPDATE, ACQUIRE_CONDITION, {
      [VALUES.zero]: 0,
      [VALUES.one]: 1,
      [VALUES.limit]: limit,
      [VALUES.entry]: {
        [HOLDER_ACQUIRED_AT]: now,
        [HOLDER_REDRIVE_COUNT]: redriveCount,
        ...(leaseSeconds === undefined ? {} : { [HOLDER_LEASE_SECONDS]: leaseSeconds }),
      },
    })) {
      // Finished meanwhile (the event was late, the body short): give it back rather than leak it.
      const after = await sfn.send(new DescribeExecutionCommand({ executionArn }));
      if (after.status !== 'RUNNING') {
        await release(table, lockName, executionArn, { acquiredAt: now });
        return { executionArn, resumedAt, action: 'permit taken again, then given back' };
      }
      return { executionArn, resumedAt, action: 'permit taken again' };
    }
    const renewal = { [VALUES.acquiredAt]: now, [VALUES.redriveCount]: redriveCount };
    if (await conditionalUpdate(table, lockName, executionArn, RENEW_UPDATE, RELEASE_CONDITION, renewal)) {
      return { executionArn, resumedAt, action: 'still holds its permit' };
    }
  }
  await sfn.send(
    new StopExecutionCommand({
      executionArn,
      error: 'SemaphoreRedriveRejected',
      cause: `Redriven at '${resumedAt}', inside the protected body, while every permit of lock '${lockName}' was taken`,
    }),
  );
  return { executionArn, resumedAt, action: 'stopped' };
}

/** One conditional write on a holder of a lock; false if its condition failed. */
async function conditionalUpdate(
  table: string,
  lockName: string,
  holder: string,
  update: string,
  condition: string,
  values: Record<string, unknown>,
): Promise<boolean> {
  try {
    await ddb.send(
      new UpdateCommand({
        TableName: table,
        Key: { [LOCK_KEY]: lockName },
        UpdateExpression: update,
        ConditionExpression: condition,
        ExpressionAttributeNames: {
          [NAMES.holder]: holder,
          ...(update.includes(NAMES.permits) ? { [NAMES.permits]: PERMITS_IN_USE } : {}),
          ...(update.includes(NAMES.limit) ? { [NAMES.limit]: CONCURRENCY_LIMIT } : {}),
          ...(update.includes(NAMES.fence) ? { [NAMES.fence]: FENCING_TOKEN } : {}),
        },
        ExpressionAttributeValues: values,
      }),
    );
    return true;
  } catch (e) {
    if ((e as Error).name === 'ConditionalCheckFailedException') return false;
    throw e;
  }
}

/** The last state the execution entered before its latest redrive (where it resumes), and when that redrive was. */
async function resumedState(executionArn: string): Promise<{ state: string; redrivenAt: string } | undefined> {
  let redrivenAt: string | undefined;
  let nextToken: string | undefined;
  do {
    const page = await sfn.send(
      new GetExecutionHistoryCommand({ executionArn, reverseOrder: true, maxResults: 100, nextToken, includeExecutionData: false }),
    );
    for (const event of page.events ?? ([] as HistoryEvent[])) {
      if (event.type === 'ExecutionRedriven' && redrivenAt === undefined) {
        redrivenAt = new Date(event.timestamp ?? Date.now()).toISOString();
      } else if (redrivenAt !== undefined && event.stateEnteredEventDetails?.name) {
        return { state: event.stateEnteredEventDetails.name, redrivenAt };
      }
    }
    nextToken = page.nextToken;
  } while (nextToken);
  return undefined;
}

/** `NAME` from the environment, or read from the input at the path `NAME_PATH` (`$.a.b`). */
function fromEnvOrInput(name: string, input: unknown): unknown {
  if (process.env[name] !== undefined) return process.env[name];
  const path = requiredEnv(`${name}_PATH`);
  return path
    .replace(/^\$\.?/, '')
    .split('.')
    .filter((part) => part !== '')
    .reduce<unknown>((value, key) => (value as Record<string, unknown> | undefined)?.[key], input);
}

/**
 * CloudWatch metrics in the Embedded Metric Format: log lines that CloudWatch turns into metrics, so
 * the function needs no cloudwatch:PutMetricData permission.
 */
function emitMetrics(table: string, permitsInUse: Map<string, number>, result: ReconcilerResult): void {
  const namespace = process.env.METRICS_NAMESPACE ?? 'CdkSfnSemaphore';
  const timestamp = Date.now();
  for (const [lockName, permits] of permitsInUse) {
    console.log(
      JSON.stringify({
        _aws: { Timestamp: timestamp, CloudWatchMetrics: [{ Namespace: namespace, Dimensions: [['TableName', 'LockName']], Metrics: [{ Name: 'PermitsInUse', Unit: 'Count' }] }] },
        TableName: table,
        LockName: lockName,
        PermitsInUse: permits,
      }),
    );
  }
  console.log(
    JSON.stringify({
      _aws: {
        Timestamp: timestamp,
        CloudWatchMetrics: [
          {
            Namespace: namespace,
            Dimensions: [['TableName']],
            Metrics: [
              { Name: 'PermitsReclaimed', Unit: 'Count' },
              { Name: 'LeasesExpired', Unit: 'Count' },
              { Name: 'ReconcilerErrors', Unit: 'Count' },
            ],
          },
        ],
      },
      TableName: table,
      PermitsReclaimed: result.dryRun ? 0 : result.reclaimed.length,
      LeasesExpired: result.stopped.length,
      ReconcilerErrors: result.errors.length,
    }),
  );
  // The details on lines of their own: a large sweep must not push the metrics over the size of a log event.
  for (const reclaimed of result.reclaimed) console.log(JSON.stringify({ reclaimed, dryRun: result.dryRun }));
  for (const error of result.errors) console.log(JSON.stringify({ error }));
  if (result.truncated) console.log(JSON.stringify({ truncated: true, locks: result.locks, holders: result.holders }));
}

function requiredEnv(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`environment variable ${name} is not set`);
  return value;
}
