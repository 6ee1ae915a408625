import { HistoryEvent } from '@aws-sdk/client-sfn';
import { clock, document, errorName, Flow, stepFunctions } from '../client/effects';
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
 * What the reconciler does, as flows (client/effects.ts): the Lambda handler runs them against AWS,
 * the protocol checker (checker/) step by step in its model. Everything that varies comes in through
 * `ReconcilerConfig` or an effect, never from the environment or the clock directly.
 */

/** The reconciler's settings (the Lambda function reads them from its environment). */
export interface ReconcilerConfig {
  readonly tableName: string;
  /** Executions whose ARN starts with one of these are ours to describe, stop and release. */
  readonly executionPrefixes: string[];
  /** A lease counts as expired only this long after its end, for clock skew between machines. */
  readonly clockSkewMs: number;
  /** The lock the redrive guard takes: a name, or a path into the execution input. */
  readonly lockName?: string;
  readonly lockNamePath?: string;
  /** The limit of that lock: a number, or a path into the execution input. */
  readonly concurrencyLimit?: number;
  readonly concurrencyLimitPath?: string;
  /** The lease of a permit the redrive guard takes, seconds. */
  readonly leaseSeconds?: number;
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
  /** Permits in use per lock, after the sweep. */
  permitsInUse: Record<string, number>;
}

/** Statuses of an execution that will never give its permit back itself (a missing one counts too). */
const RELEASABLE_STATUSES = ['SUCCEEDED', 'FAILED', 'TIMED_OUT', 'ABORTED', 'DOES_NOT_EXIST'];

/** Whether an execution ARN belongs to one of our state machines. */
export function isOurs(config: ReconcilerConfig, executionArn: string): boolean {
  return config.executionPrefixes.some((prefix) => executionArn.startsWith(prefix));
}

/**
 * One sweep of the lock table. `outOfTime` is asked before each lock and holder: the sweep stops early,
 * and says so, when it answers true.
 */
export function* sweep(config: ReconcilerConfig, dryRun: boolean, outOfTime: () => boolean = () => false): Flow<ReconcilerResult> {
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
    permitsInUse: {},
  };
  let startKey: Record<string, unknown> | undefined;
  scan: do {
    const page = yield* document('Scan', { TableName: config.tableName, ConsistentRead: true, ExclusiveStartKey: startKey });
    for (const item of (page.Items ?? []) as Array<Record<string, any>>) {
      if (outOfTime()) {
        result.truncated = true;
        break scan;
      }
      const lockName = String(item[LOCK_KEY]);
      result.locks++;
      let held = Number(item[PERMITS_IN_USE] ?? 0);
      const holders = Object.entries(item).filter(([, v]) => isHolderEntry(v));
      result.holders += holders.length;
      for (const [holder, entry] of holders) {
        // A lock can have thousands of holders: the time bound holds inside one lock too.
        if (outOfTime()) {
          result.truncated = true;
          result.permitsInUse[lockName] = held;
          break scan;
        }
        try {
          const reason = yield* reconcileHolder(config, lockName, holder, entry as HolderEntry, dryRun, result);
          if (reason !== undefined) {
            result.reclaimed.push({ lockName, holder, reason });
            if (!dryRun) held--;
          }
        } catch (e) {
          result.errors.push({ lockName, holder, error: describeError(e) });
        }
      }
      result.permitsInUse[lockName] = held;
      const waiters = item[WAITERS];
      if (!dryRun && Array.isArray(waiters) && waiters.length > 0 && !outOfTime()) {
        try {
          const served = yield* serveQueue({ tableName: config.tableName, isGone: (arn) => isGone(config, arn) }, lockName);
          result.waitersRemoved += served.removed;
          result.waitersAdmitted += served.admitted;
        } catch (e) {
          result.errors.push({ lockName, holder: WAITERS, error: describeError(e) });
        }
      }
    }
    startKey = page.LastEvaluatedKey;
  } while (startKey);
  return result;
}

function describeError(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

/** Whether a queued execution can never be woken: not ours to judge (false), or no longer running. */
function* isGone(config: ReconcilerConfig, executionArn: string): Flow<boolean> {
  if (!isOurs(config, executionArn)) return false;
  return RELEASABLE_STATUSES.includes(yield* executionStatus(executionArn));
}

/** The execution's status, DOES_NOT_EXIST for one that does not exist. */
function* executionStatus(executionArn: string): Flow<string> {
  try {
    return (yield* stepFunctions('DescribeExecution', { executionArn })).status ?? 'UNKNOWN';
  } catch (e) {
    if (errorName(e) !== 'ExecutionDoesNotExist') throw e;
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
function* reconcileHolder(
  config: ReconcilerConfig,
  lockName: string,
  holder: string,
  entry: HolderEntry,
  dryRun: boolean,
  result: ReconcilerResult,
): Flow<string | undefined> {
  const now = yield* clock();
  if (!isExecutionHolder(holder)) {
    const expiresAt = entry[HOLDER_LEASE_EXPIRES_AT];
    if (expiresAt === undefined || now <= expiresAt + config.clockSkewMs) {
      return undefined;
    }
    if (!dryRun && !(yield* release(config, lockName, holder, { leaseExpiresAt: expiresAt }))) return undefined;
    return `lease expired at ${new Date(expiresAt).toISOString()}`;
  }

  if (!isOurs(config, holder)) {
    // Another state machine's execution: its own reconciler, with its own permissions, sweeps it.
    return undefined;
  }
  const status = yield* executionStatus(holder);
  if (!RELEASABLE_STATUSES.includes(status)) {
    if (status !== 'RUNNING') return undefined; // PENDING_REDRIVE, or a status this code does not know: leave it
  } else {
    if (!dryRun && !(yield* release(config, lockName, holder, { acquiredAt: entry[HOLDER_ACQUIRED_AT] }))) return undefined;
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
  yield* stepFunctions('StopExecution', {
    executionArn: holder,
    error: 'SemaphoreLeaseExpired',
    cause: `Held a permit of lock '${lockName}' for more than its lease of ${leaseSeconds} s (since ${entry[HOLDER_ACQUIRED_AT]})`,
  });
  result.stopped.push(holder);
  if (!(yield* release(config, lockName, holder, { acquiredAt: entry[HOLDER_ACQUIRED_AT] }))) return undefined;
  return `lease of ${leaseSeconds} s expired at ${new Date(leaseEnd).toISOString()}; execution stopped`;
}

/**
 * The cleanup's conditional release, further conditional on the entry the sweep read: its lease end
 * (a script may renew it) or its acquire time (a redriven execution takes a new entry under the same
 * name). False if the holder was gone or changed meanwhile: nothing to do.
 */
function* release(
  config: ReconcilerConfig,
  lockName: string,
  holder: string,
  seen: { readonly leaseExpiresAt: number } | { readonly acquiredAt: string },
): Flow<boolean> {
  const [condition, values] =
    'leaseExpiresAt' in seen
      ? [RELEASE_EXPIRED_LEASE_CONDITION, { [VALUES.expiresAt]: seen.leaseExpiresAt }]
      : [RELEASE_SEEN_HOLDER_CONDITION, { [VALUES.acquiredAt]: seen.acquiredAt }];
  return yield* conditionalUpdate(config, lockName, holder, RELEASE_UPDATE, condition, { [VALUES.one]: 1, ...values });
}

/**
 * The redrive guard. `RedriveExecution` resumes an execution at the state where it stopped; stopped
 * inside the body, it resumes inside the body, and its permit was freed by the cleanup meanwhile. On
 * its RUNNING status-change event, if it still runs: take a permit for it again; if every permit is
 * taken, stop it (error `SemaphoreRedriveRejected`). Redriven before the body, it takes its own, and
 * an entry left from before the redrive is freed. Redriven after the body, it gives back its own.
 */
export function* guardRedrive(config: ReconcilerConfig, detail: StatusChangeDetail): Flow<RedriveGuardResult> {
  const executionArn = detail.executionArn;
  if (!isOurs(config, executionArn)) {
    return { executionArn, action: 'not ours' };
  }
  // The event may be late: act only on an execution that still runs.
  const described = yield* stepFunctions('DescribeExecution', { executionArn });
  if (described.status !== 'RUNNING') {
    return { executionArn, action: 'no longer running' };
  }
  const resumed = yield* resumedState(executionArn);
  const resumedAt = resumed?.state;
  const input = JSON.parse(detail.input ?? described.input ?? '{}');
  const lockName = String(fromConfigOrInput(config.lockName, config.lockNamePath, input));
  const limit = Number(fromConfigOrInput(config.concurrencyLimit, config.concurrencyLimitPath, input));
  if (resumed !== undefined && BEFORE_BODY_STATES.includes(resumed.state)) {
    // It will take its own permit; an entry from before the redrive (an acquire that landed after its
    // stop) would make that acquire fail on its own name, forever. Free it.
    const freed = yield* conditionalUpdate(config, lockName, executionArn, RELEASE_UPDATE, RELEASE_TAKEN_BEFORE_CONDITION, {
      [VALUES.one]: 1,
      [VALUES.acquiredAt]: resumed.redrivenAt,
    });
    // A queue entry of the run before would be renewed in place by this run, and carry that run's
    // count into the permit handed to it, where a late cleanup of that run could free it. It queues anew.
    const run = described.redriveCount ?? detail.redriveCount ?? 1;
    yield* dropWaiter({ tableName: config.tableName }, lockName, executionArn, run);
    return { executionArn, resumedAt, action: freed ? 'stale permit released' : 'outside the body' };
  }
  if (resumedAt === undefined || OUTSIDE_BODY_STATES.includes(resumedAt)) {
    return { executionArn, resumedAt, action: 'outside the body' };
  }
  const leaseSeconds = config.leaseSeconds;
  // The run the entry belongs to, so that a late cleanup of the run before the redrive leaves it.
  const redriveCount = described.redriveCount ?? detail.redriveCount ?? 1;
  // Take a permit again; if it still holds one (its cleanup never ran), renew the entry instead, so
  // that a sweep that judged the old entry dead leaves it alone. A release between the two tries
  // makes the acquire worth another go.
  for (let attempt = 0; attempt < 3; attempt++) {
    const now = new Date(yield* clock()).toISOString();
    if (
      yield* conditionalUpdate(config, lockName, executionArn, ACQUIRE_UPDATE, ACQUIRE_CONDITION, {
        [VALUES.zero]: 0,
        [VALUES.one]: 1,
        [VALUES.limit]: limit,
        [VALUES.entry]: {
          [HOLDER_ACQUIRED_AT]: now,
          [HOLDER_REDRIVE_COUNT]: redriveCount,
          ...(leaseSeconds === undefined ? {} : { [HOLDER_LEASE_SECONDS]: leaseSeconds }),
        },
      })
    ) {
      // Finished meanwhile (the event was late, the body short): give it back rather than leak it.
      const after = yield* stepFunctions('DescribeExecution', { executionArn });
      if (after.status !== 'RUNNING') {
        yield* release(config, lockName, executionArn, { acquiredAt: now });
        return { executionArn, resumedAt, action: 'permit taken again, then given back' };
      }
      return { executionArn, resumedAt, action: 'permit taken again' };
    }
    const renewal = { [VALUES.acquiredAt]: now, [VALUES.redriveCount]: redriveCount };
    if (yield* conditionalUpdate(config, lockName, executionArn, RENEW_UPDATE, RELEASE_CONDITION, renewal)) {
      return { executionArn, resumedAt, action: 'still holds its permit' };
    }
  }
  yield* stepFunctions('StopExecution', {
    executionArn,
    error: 'SemaphoreRedriveRejected',
    cause: `Redriven at '${resumedAt}', inside the protected body, while every permit of lock '${lockName}' was taken`,
  });
  return { executionArn, resumedAt, action: 'stopped' };
}

/** One conditional write on a holder of a lock; false if its condition failed. */
function* conditionalUpdate(
  config: ReconcilerConfig,
  lockName: string,
  holder: string,
  update: string,
  condition: string,
  values: Record<string, unknown>,
): Flow<boolean> {
  try {
    yield* document('Update', {
      TableName: config.tableName,
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
    });
    return true;
  } catch (e) {
    if (errorName(e) === 'ConditionalCheckFailedException') return false;
    throw e;
  }
}

/** The last state the execution entered before its latest redrive (where it resumed), and when that redrive was. */
function* resumedState(executionArn: string): Flow<{ state: string; redrivenAt: string } | undefined> {
  let redrivenAt: string | undefined;
  let nextToken: string | undefined;
  do {
    const page = yield* stepFunctions('GetExecutionHistory', { executionArn, reverseOrder: true, maxResults: 100, nextToken, includeExecutionData: false });
    for (const event of (page.events ?? []) as HistoryEvent[]) {
      if (event.type === 'ExecutionRedriven' && redrivenAt === undefined) {
        redrivenAt = new Date(event.timestamp ?? 0).toISOString();
      } else if (redrivenAt !== undefined && event.stateEnteredEventDetails?.name) {
        return { state: event.stateEnteredEventDetails.name, redrivenAt };
      }
    }
    nextToken = page.nextToken;
  } while (nextToken);
  return undefined;
}

/** A fixed value, or read from the input at a path (`$.a.b`). */
function fromConfigOrInput(fixed: unknown, path: string | undefined, input: unknown): unknown {
  if (fixed !== undefined) return fixed;
  if (path === undefined) throw new Error('neither a value nor a path into the input is configured');
  return path
    .replace(/^\$\.?/, '')
    .split('.')
    .filter((part) => part !== '')
    .reduce<unknown>((value, key) => (value as Record<string, unknown> | undefined)?.[key], input);
}
