import { HistoryEvent } from '@aws-sdk/client-sfn';
import { clock, document, errorName, Flow, stepFunctions } from '../client/effects';
import { QueueServiceResult, serveQueue } from '../client/queue-service';
import { deleteServedTicket, serveTicket } from '../client/ticket-queue';
import {
  ACQUIRE_CONDITION,
  ACQUIRE_WITH_BODY_SLOT_CONDITION,
  ACQUIRE_WITH_BODY_SLOT_UPDATE,
  BODIES_RUNNING,
  BODY_SLOT_AND_PERMIT_HELD_CONDITION,
  CLAIM_WITH_BODY_SLOT_CONDITION,
  CLAIM_WITH_BODY_SLOT_UPDATE,
  BODY_LIMIT,
  HOLDER_IN_BODY,
  ACQUIRE_UPDATE,
  CLAIM_CONDITION,
  CLAIM_UPDATE,
  CONCURRENCY_LIMIT,
  FENCING_TOKEN,
  HOLDER_ACQUIRED_AT,
  HOLDER_LEASE_EXPIRES_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  executionArnOfHolder,
  executionHolderKeyOfArn,
  isExecutionHolder,
  LOCK_KEY,
  NAMES,
  PERMITS_IN_USE,
  QUEUE_VALUES,
  RELEASE_EXPIRED_LEASE_CONDITION,
  RELEASE_SEEN_HOLDER_CONDITION,
  RELEASE_UPDATE,
  WEIGHTED_ACQUIRE_CONDITION,
  WEIGHTED_ACQUIRE_UPDATE,
  WEIGHTED_CLAIM_CONDITION,
  RELEASE_PARTIAL_CONDITION,
  RETAKE_PERMIT_IN_SLOT_CONDITION,
  RETAKE_PERMIT_IN_SLOT_UPDATE,
  HOLDER_PERMITS,
  HOLDER_EXTRA_PERMITS,
  VALUES,
  isTicketKey,
  QUEUE_HEAD,
  QUEUE_TAIL,
  TICKET_KEY_SEPARATOR,
  TICKET_SERVED_BY,
  TICKET_WAITER,
  RATE_INTERVAL,
  COLLECTING,
  HOLDER_COLLECTING,
  LOCK_STRIPE_FIELD,
  LOCK_STRIPE_SEPARATOR,
} from '../src/private/lock-schema';
import { needsBodySlot, OUTSIDE_BODY_STATES, STATE } from '../src/private/state-names';

/*
 * What the reconciler does, as flows (client/effects.ts): the Lambda handler runs them against AWS,
 * the protocol checker (checker/) step by step in its model. Everything that varies comes in through
 * `ReconcilerConfig` or an effect, never from the environment or the clock directly.
 */

/** The reconciler's settings (the Lambda function reads them from its environment). */
export interface ReconcilerConfig {
  readonly tableName: string;
  /**
   * The state machines whose executions are ours to describe, stop and release (their holder ids
   * name them by a hash of their name: see `executionHolderKey`), and whose redriven executions the
   * sweep checks where the reconciler guards a lock (see `guardRedriven`).
   */
  readonly stateMachineArns: readonly string[];
  /** A lease counts as expired only this long after its end, for clock skew between machines. */
  readonly clockSkewMs: number;
  /** The lock the redrive guard takes: a name, or a path into the execution input. */
  readonly lockName?: string;
  readonly lockNamePath?: string;
  /**
   * How many stripes that lock is split into (`<lock name>#<n>`): the guard takes the permit on the
   * stripe the execution drew, read from its history. @default 1
   */
  readonly lockStripes?: number;
  /** The limit of that lock: a number, or a path into the execution input. */
  readonly concurrencyLimit?: number;
  readonly concurrencyLimitPath?: string;
  /** The permits one execution of that lock takes (its weight): a number, or a path into the input. @default 1 */
  readonly permits?: number;
  readonly permitsPath?: string;
  /** The lease of a permit the redrive guard takes, seconds. */
  readonly leaseSeconds?: number;
  /**
   * The sweep leaves alone entries younger than this, milliseconds: DescribeExecution is eventually
   * consistent, and an execution a moment old can read as not existing. @default GRACE_MS
   */
  readonly graceMs?: number;
  /**
   * How long after a redrive the guard keeps answering "cannot tell yet" (an error, so that Lambda
   * invokes it again) before it stops the execution instead, milliseconds. @default GUARD_PATIENCE_MS
   */
  readonly guardPatienceMs?: number;
  /**
   * The workflows' rate interval, milliseconds: every start of a body holds its permit at least this
   * long, so a stopped holder's permit is freed only this long after it stopped (plus `clockSkewMs`).
   * @default - none: freed as soon as its holder is seen stopped
   */
  readonly holdAfterStopMs?: number;
}

/**
 * The sweep's grace period: DescribeExecution and GetExecutionHistory are eventually consistent ("may
 * not reflect very recent updates"); AWS gives no bound, and reads lag by well under a second in
 * practice. An entry, and an execution, older than this are read as they are.
 */
export const GRACE_MS = 60_000;

/**
 * How long the redrive guard retries a decision it cannot make on what it reads (Lambda invokes a
 * failed asynchronous invocation again after about one and three minutes): past this, it stops the
 * execution rather than let it run its body without a permit.
 */
export const GUARD_PATIENCE_MS = 150_000;

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
    | 'superseded'
    | 'no longer running'
    | 'outside the body'
    | 'permit taken again'
    | 'permit taken again, then given back'
    | 'still holds its permit'
    | 'stopped'
    | 'stopped, unverified';
}

/** What the redrive guard is invoked with: a status-change event of a redriven execution. */
export interface RedriveEvent {
  readonly detail: StatusChangeDetail;
  /** When the event happened (ISO-8601): the guard's patience counts from it. */
  readonly time?: string;
}

/**
 * The redrive guard cannot decide on what it read (an eventually consistent description or history
 * that does not show the redrive yet): the invocation fails, and Lambda invokes it again.
 */
export class RedriveUndecided extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RedriveUndecided';
  }
}

/** A permit the sweep released (or, in a dry run, would release). */
export interface Reclaimed {
  readonly lockName: string;
  /** Its holder id (for an execution, see `executionHolderKey`). */
  readonly holder: string;
  /** The execution's ARN, for a holder that is an execution. */
  readonly executionArn?: string;
  readonly reason: string;
  /**
   * The entry was a client's registration to go next (a waiting CLI's, marked as the collector, holding
   * no permit), gone with its lease: it held nothing, so the `PermitsReclaimed` metric does not count it.
   */
  readonly registration?: boolean;
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
  /** Permits in use per lock, after the sweep (counted by weight: a weighted holder's are all counted). */
  permitsInUse: Record<string, number>;
  /** Holders per lock, after the sweep: below `permitsInUse` where holders are weighted. */
  holdersByLock: Record<string, number>;
  /** Tickets of each lock's queue not yet served, as the sweep read the lock item (waiters that poll are in no queue). */
  queuedByLock: Record<string, number>;
  /**
   * Per lock with a rate (RATE_INTERVAL): each holder left after the sweep, with the end of its
   * acquisition's interval (epoch ms). The rate holds its permits until then at least (PermitsHeldForRate).
   */
  rateHoldsByLock: Record<string, RateHold[]>;
  /** What the guard did for redriven executions that still run (the redrive guard's event may have been lost). */
  redriven: RedriveGuardResult[];
}

/** A holder of a lock with a rate: its permits, and when its acquisition's interval ends (epoch ms). */
export interface RateHold {
  readonly permits: number;
  readonly endsAt: number;
}

/**
 * Permits that the rate holds at `now`, at least: those of holders still inside their acquisition's
 * interval. A lower bound, since an execution's interval runs from its body's start (or its failure, or
 * its stop), later than the acquire its entry records.
 */
export function permitsHeldForRate(holds: RateHold[], now: number): number {
  return holds.filter((h) => h.endsAt > now).reduce((sum, h) => sum + h.permits, 0);
}

/** Statuses of an execution that will never give its permit back itself (a missing one counts too). */
const RELEASABLE_STATUSES = ['SUCCEEDED', 'FAILED', 'TIMED_OUT', 'ABORTED', 'DOES_NOT_EXIST'];

/** Whether an execution ARN belongs to one of our state machines. */
export function isOurs(config: ReconcilerConfig, executionArn: string): boolean {
  // An ARN names itself; a holder id would name another string.
  return executionArnOfHolder(executionArn, config.stateMachineArns) === executionArn;
}

/** The two parts of a sweep (both, by default): the lock table's holders and queues, and the redriven executions. */
export interface SweepParts {
  readonly holders: boolean;
  readonly redriven: boolean;
}

/**
 * One sweep of the lock table. `outOfTime` is asked before each lock and holder: the sweep stops early,
 * and says so, when it answers true. (The protocol checker runs its two parts as separate flows, which
 * covers every interleaving of the whole.)
 */
export function* sweep(
  config: ReconcilerConfig,
  dryRun: boolean,
  outOfTime: () => boolean = () => false,
  parts: SweepParts = { holders: true, redriven: true },
): Flow<ReconcilerResult> {
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
    holdersByLock: {},
    queuedByLock: {},
    rateHoldsByLock: {},
    redriven: [],
  };
  // Tickets passed so far, per lock: only ever more, so a value read earlier in the sweep is safe.
  const heads = new Map<string, number>();
  let startKey: Record<string, unknown> | undefined;
  scan: do {
    if (!parts.holders) break;
    const page = yield* document('Scan', { TableName: config.tableName, ConsistentRead: true, ExclusiveStartKey: startKey });
    for (const item of (page.Items ?? []) as Array<Record<string, any>>) {
      if (outOfTime()) {
        result.truncated = true;
        break scan;
      }
      const lockName = String(item[LOCK_KEY]);
      if (isTicketKey(lockName)) {
        if (dryRun) continue;
        try {
          if (yield* tidyTicket(config, lockName, item, heads)) result.waitersRemoved++;
        } catch (e) {
          result.errors.push({ lockName, holder: 'ticket', error: describeError(e) });
        }
        continue;
      }
      result.locks++;
      let held = Number(item[PERMITS_IN_USE] ?? 0);
      const holders = Object.entries(item).filter(([, v]) => isHolderEntry(v));
      result.holders += holders.length;
      let holding = holders.length;
      for (const [holder, entry] of holders) {
        // A lock can have thousands of holders: the time bound holds inside one lock too.
        if (outOfTime()) {
          result.truncated = true;
          result.permitsInUse[lockName] = held;
          result.holdersByLock[lockName] = holding;
          break scan;
        }
        try {
          const swept = entry as HolderEntry;
          const reason = yield* reconcileHolder(config, lockName, holder, swept, dryRun, result);
          if (reason !== undefined) {
            const permits = Number(swept[HOLDER_PERMITS] ?? 1);
            const registration = !isExecutionHolder(holder) && swept[HOLDER_COLLECTING] !== undefined && permits === 0;
            const executionArn = executionArnOfHolder(holder, config.stateMachineArns);
            result.reclaimed.push({ lockName, holder, ...(executionArn ? { executionArn } : {}), reason, ...(registration ? { registration } : {}) });
            if (!dryRun) {
              held -= permits;
              holding--;
            }
          }
        } catch (e) {
          result.errors.push({ lockName, holder, error: describeError(e) });
        }
      }
      result.permitsInUse[lockName] = held;
      result.holdersByLock[lockName] = holding;
      result.queuedByLock[lockName] = Math.max(0, Number(item[QUEUE_TAIL] ?? 0) - Number(item[QUEUE_HEAD] ?? 0));
      if (item[RATE_INTERVAL] !== undefined) {
        const reclaimed = new Set(result.reclaimed.filter((r) => r.lockName === lockName).map((r) => r.holder));
        result.rateHoldsByLock[lockName] = holders
          .filter(([holder]) => dryRun || !reclaimed.has(holder))
          .map(([, entry]) => ({
            permits: Number((entry as HolderEntry)[HOLDER_PERMITS] ?? 1),
            endsAt: Date.parse(String((entry as HolderEntry)[HOLDER_ACQUIRED_AT])) + Number(item[RATE_INTERVAL]) * 1000,
          }));
      }
      if (!dryRun && Number(item[QUEUE_TAIL] ?? 0) > Number(item[QUEUE_HEAD] ?? 0) && !outOfTime()) {
        try {
          const served = yield* serveWaiters(config, lockName);
          result.waitersRemoved += served.removed;
          result.waitersAdmitted += served.admitted;
        } catch (e) {
          result.errors.push({ lockName, holder: 'queue', error: describeError(e) });
        }
      }
    }
    startKey = page.LastEvaluatedKey;
  } while (startKey);
  // The redrive guard's backstop, where the reconciler guards a lock.
  if (parts.redriven && !dryRun && !result.truncated && (config.lockName !== undefined || config.lockNamePath !== undefined)) {
    for (const stateMachineArn of config.stateMachineArns) {
      try {
        yield* guardRedriven(config, stateMachineArn, result, outOfTime);
      } catch (e) {
        result.errors.push({ lockName: '', holder: stateMachineArn, error: describeError(e) });
      }
    }
  }
  return result;
}

/**
 * A ticket item whose ticket the lock has passed: delete it if it was marked served (a ticket a
 * workflow's release skipped, or one the client or this queue service served and whose wake-up
 * failed; a workflow's release deletes the item of a ticket it serves), or mark it served if a waiter
 * sleeps on it (a run that resumed its first wait after the item was deleted), so that its next wait
 * is refused and it takes a new ticket. True when the item went.
 */
function* tidyTicket(config: ReconcilerConfig, key: string, item: Record<string, any>, heads: Map<string, number>): Flow<boolean> {
  const at = key.lastIndexOf(TICKET_KEY_SEPARATOR);
  const lockName = key.slice(0, at);
  const ticket = Number(key.slice(at + TICKET_KEY_SEPARATOR.length));
  if (!heads.has(lockName)) {
    const lock = (yield* document('Get', { TableName: config.tableName, Key: { [LOCK_KEY]: lockName }, ConsistentRead: true })).Item;
    heads.set(lockName, Number(lock?.[QUEUE_HEAD] ?? 0));
  }
  if (!(ticket <= heads.get(lockName)!)) return false;
  const servedBy = item[TICKET_SERVED_BY];
  if (typeof servedBy === 'string') return yield* deleteServedTicket(config.tableName, lockName, ticket, servedBy);
  if (item[TICKET_WAITER] !== undefined) yield* serveTicket(config.tableName, lockName, ticket, 'passed');
  return false;
}

/**
 * The redrive guard acts on an event, which EventBridge delivers "best effort". Each sweep also guards
 * every redriven execution of `stateMachineArn` that still runs: one in its body without a permit
 * stamped with its run takes one, or is stopped. A run that resumed outside the body, or holds its
 * permit, is left alone.
 */
function* guardRedriven(config: ReconcilerConfig, stateMachineArn: string, result: ReconcilerResult, outOfTime: () => boolean): Flow<void> {
  let nextToken: string | undefined;
  do {
    const page = yield* stepFunctions('ListExecutions', { stateMachineArn, statusFilter: 'RUNNING', redriveFilter: 'REDRIVEN', nextToken });
    for (const execution of (page.executions ?? []) as Array<{ executionArn: string; redriveCount?: number }>) {
      if (outOfTime()) return;
      try {
        result.redriven.push(yield* guardRun(config, execution.executionArn, execution.redriveCount, undefined));
      } catch (e) {
        // Undecided now: the next sweep looks again.
        if (!(e instanceof RedriveUndecided)) result.errors.push({ lockName: '', holder: execution.executionArn, error: describeError(e) });
      }
    }
    nextToken = page.nextToken;
  } while (nextToken);
}

function describeError(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

/**
 * Whether the run of a queued execution can never be woken: it stopped, or a later run of it runs.
 * Not ours to judge, or not found (a moment-old execution may not be visible yet): not gone.
 */
function* isGone(config: ReconcilerConfig, waiter: string, run: number): Flow<boolean> {
  const executionArn = executionArnOfHolder(waiter, config.stateMachineArns);
  if (executionArn === undefined) return false;
  const described = yield* describe(executionArn);
  if (described.status === 'DOES_NOT_EXIST') return false;
  return described.redriveCount > run || RELEASABLE_STATUSES.includes(described.status);
}

/**
 * Hand the permits the guard gave back to the lock's waiters, as the workflows' releases do (the
 * guard's conditional releases ignore the queue): else a waiter sleeps beside a free permit until its
 * `queueCheckInterval` or the next sweep. One consistent read when nobody waits.
 */
function* serveWaiters(config: ReconcilerConfig, lockName: string): Flow<QueueServiceResult> {
  return yield* serveQueue({ tableName: config.tableName, isGone: (waiter, run) => isGone(config, waiter, run) }, lockName);
}

/** What DescribeExecution says: status (DOES_NOT_EXIST for one it does not find), run, input. */
function* describe(executionArn: string): Flow<Described> {
  try {
    const d = yield* stepFunctions('DescribeExecution', { executionArn });
    return {
      status: d.status ?? 'UNKNOWN',
      redriveCount: d.redriveCount ?? 0,
      input: d.input,
      stopDate: epochMillis(d.stopDate),
      redriveDate: epochMillis(d.redriveDate),
    };
  } catch (e) {
    if (errorName(e) !== 'ExecutionDoesNotExist') throw e;
    return { status: 'DOES_NOT_EXIST', redriveCount: 0 };
  }
}

interface Described {
  readonly status: string;
  readonly redriveCount: number;
  readonly input?: string;
  /** When the run stopped, epoch ms (a stopped run). */
  readonly stopDate?: number;
  /** When it was last redriven, epoch ms. */
  readonly redriveDate?: number;
}

/** A timestamp of the Step Functions API: a Date (the SDK), epoch seconds (its JSON) or ISO-8601. */
function epochMillis(value: unknown): number | undefined {
  if (value instanceof Date) return value.getTime();
  if (typeof value === 'number') return value * 1000;
  if (typeof value === 'string') return Date.parse(value);
  return undefined;
}

interface HolderEntry {
  readonly [HOLDER_ACQUIRED_AT]: string;
  readonly [HOLDER_REDRIVE_COUNT]?: number;
  readonly [HOLDER_LEASE_SECONDS]?: number;
  readonly [HOLDER_LEASE_EXPIRES_AT]?: number;
  readonly [HOLDER_PERMITS]?: number;
  readonly [HOLDER_COLLECTING]?: number;
}

function isHolderEntry(value: unknown): boolean {
  return typeof value === 'object' && value !== null && typeof (value as Record<string, unknown>)[HOLDER_ACQUIRED_AT] === 'string';
}

/**
 * Decide about one holder; release it if it must go. Returns why it was released, or undefined.
 *
 * What it reads may be stale, so it judges a run, and releases only an entry stamped by that run or an
 * earlier one (and still the entry it read): an entry younger than the grace period is left alone
 * (its execution may not be visible yet), and so is one stamped by a later run than the description
 * knows (the description is older than the entry).
 */
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

  const executionArn = executionArnOfHolder(holder, config.stateMachineArns);
  if (executionArn === undefined) {
    // Another state machine's execution: its own reconciler, with its own permissions, sweeps it.
    return undefined;
  }
  const acquiredAt = entry[HOLDER_ACQUIRED_AT];
  // An entry this code cannot read the time of is never a reason to release anything.
  if (!(now - Date.parse(acquiredAt) >= (config.graceMs ?? GRACE_MS))) return undefined;
  const entryRun = entry[HOLDER_REDRIVE_COUNT] ?? 0;
  const described = yield* describe(executionArn);
  const { status, redriveCount } = described;
  const releaseRun = function* (run: number, reason: string): Flow<string | undefined> {
    if (!dryRun && !(yield* release(config, lockName, holder, { acquiredAt, run }))) return undefined;
    return reason;
  };
  // Under a rate limit, a permit is freed only once the rate's interval has passed since its holder
  // last could have started the body: since it stopped (or, for a run that has ended, since the
  // redrive that followed it). A time this code cannot read holds the permit until the next sweep.
  const hold = config.holdAfterStopMs ?? 0;
  const heldLongEnough = (since: number | undefined) => hold === 0 || (since !== undefined && now >= since + hold + config.clockSkewMs);
  if (status === 'DOES_NOT_EXIST') {
    // Older than the grace period, so its execution would be visible: it has gone (or never was).
    if (!heldLongEnough(Date.parse(acquiredAt))) return undefined;
    return yield* releaseRun(entryRun, 'execution DOES_NOT_EXIST');
  }
  if (redriveCount < entryRun) return undefined; // a description from before the run that took the entry
  if (RELEASABLE_STATUSES.includes(status)) {
    if (!heldLongEnough(described.stopDate)) return undefined;
    return yield* releaseRun(redriveCount, `execution ${status}`);
  }
  if (status !== 'RUNNING') return undefined; // PENDING_REDRIVE, or a status this code does not know: leave it
  if (entryRun < redriveCount) {
    // Left by a run that has ended: the running one stamps every entry it takes into the body.
    if (!heldLongEnough(described.redriveDate)) return undefined;
    return yield* releaseRun(redriveCount - 1, `entry of run ${entryRun}; the execution runs run ${redriveCount}`);
  }

  const leaseSeconds = entry[HOLDER_LEASE_SECONDS];
  // 0 is no lease (an entry handed off from the queue always carries the field).
  if (leaseSeconds === undefined || !(leaseSeconds > 0)) return undefined;
  const leaseEnd = Date.parse(acquiredAt) + leaseSeconds * 1000;
  // An entry this code cannot read is never a reason to stop a running execution.
  if (!Number.isFinite(leaseEnd) || now <= leaseEnd) return undefined;
  if (dryRun) return `lease of ${leaseSeconds} s expired at ${new Date(leaseEnd).toISOString()}`;
  // Stop first, release after: the permit is never free while its execution still runs.
  yield* stepFunctions('StopExecution', {
    executionArn,
    error: 'SemaphoreLeaseExpired',
    cause: `Held a permit of lock '${lockName}' for more than its lease of ${leaseSeconds} s (since ${acquiredAt})`,
  });
  result.stopped.push(executionArn);
  // Under a rate limit the body may have started just before the stop: the cleanup, or a later
  // sweep, frees the permit once the interval has passed.
  if (hold > 0) return undefined;
  return yield* releaseRun(redriveCount, `lease of ${leaseSeconds} s expired at ${new Date(leaseEnd).toISOString()}; execution stopped`);
}

/**
 * The cleanup's conditional release, further conditional on the entry the sweep read: its lease end
 * (a script may renew it), or its acquire time and a run no later than the one judged (a redriven
 * execution takes a new entry under the same name, and every claim renews the time and the run).
 * False if the holder was gone or changed meanwhile: nothing to do.
 */
function* release(
  config: ReconcilerConfig,
  lockName: string,
  holder: string,
  seen: { readonly leaseExpiresAt: number } | { readonly acquiredAt: string; readonly run: number },
): Flow<boolean> {
  const [condition, values] =
    'leaseExpiresAt' in seen
      ? [RELEASE_EXPIRED_LEASE_CONDITION, { [VALUES.expiresAt]: seen.leaseExpiresAt }]
      : [RELEASE_SEEN_HOLDER_CONDITION, { [VALUES.acquiredAt]: seen.acquiredAt, [VALUES.redriveCount]: seen.run }];
  return yield* conditionalUpdate(config, lockName, holder, RELEASE_UPDATE, condition, { [VALUES.one]: 1, ...values });
}

/**
 * The redrive guard. `RedriveExecution` resumes an execution at the state where it stopped; stopped
 * inside the body, it resumes inside the body, and its permit was freed by the cleanup meanwhile. On
 * its RUNNING status-change event, if that run still runs inside the body: take a permit for it again
 * (or claim the one it still holds, for its new run); if every permit is taken, stop it (error
 * `SemaphoreRedriveRejected`). Redriven outside the body, the workflow takes or gives back its own.
 * Permits it gives back (a run that finished meanwhile, what is left of an entry being handed on) go
 * to the lock's waiters, as a release's would.
 *
 * It decides only on what it can trust: a description or a history that does not show this run yet
 * (both are eventually consistent) makes it fail (`RedriveUndecided`), so that Lambda invokes it again;
 * past `guardPatienceMs` after the redrive it stops the execution instead (`SemaphoreRedriveUnverified`).
 */
export function* guardRedrive(config: ReconcilerConfig, event: RedriveEvent): Flow<RedriveGuardResult> {
  const { detail } = event;
  if (!isOurs(config, detail.executionArn)) {
    return { executionArn: detail.executionArn, action: 'not ours' };
  }
  try {
    return yield* guardRun(config, detail.executionArn, detail.redriveCount, detail.input ?? undefined);
  } catch (e) {
    if (!(e instanceof RedriveUndecided)) throw e;
    const now = yield* clock();
    const since = event.time === undefined ? NaN : Date.parse(event.time);
    if (!(now - since >= (config.guardPatienceMs ?? GUARD_PATIENCE_MS))) throw e;
    yield* stepFunctions('StopExecution', {
      executionArn: detail.executionArn,
      error: 'SemaphoreRedriveUnverified',
      cause: `Redriven ${Math.round((now - since) / 1000)} s ago, and whether it runs its protected body without a permit still cannot be told: ${e.message}`,
    });
    return { executionArn: detail.executionArn, action: 'stopped, unverified' };
  }
}

/** Guard run `run` of an execution (its latest, if not given). Throws RedriveUndecided on reads it cannot trust. */
function* guardRun(
  config: ReconcilerConfig,
  executionArn: string,
  run: number | undefined,
  eventInput: string | undefined,
): Flow<RedriveGuardResult> {
  const described = yield* describe(executionArn);
  if (described.status === 'DOES_NOT_EXIST') throw new RedriveUndecided('DescribeExecution does not find the execution yet');
  const redriveCount = run ?? described.redriveCount;
  if (described.redriveCount > redriveCount) return { executionArn, action: 'superseded' }; // a later redrive's event guards it
  if (described.redriveCount < redriveCount) throw new RedriveUndecided(`DescribeExecution still shows run ${described.redriveCount}, not ${redriveCount}`);
  if (described.status !== 'RUNNING') return { executionArn, action: 'no longer running' };
  const states = yield* redriveHistory(executionArn, redriveCount);
  if (states.superseded) return { executionArn, action: 'superseded' };
  const resumedAt = states.resumedAt;
  if (!insideBody(resumedAt) || !insideBody(states.current)) {
    // Resumed outside the body (the workflow takes or gives back its own permit), or left it since.
    return { executionArn, resumedAt, action: 'outside the body' };
  }
  const input = JSON.parse(eventInput ?? described.input ?? '{}');
  const baseLockName = String(fromConfigOrInput(config.lockName, config.lockNamePath, input));
  const lockName = (config.lockStripes ?? 1) > 1 ? yield* drawnStripe(executionArn, baseLockName) : baseLockName;
  const limit = Number(fromConfigOrInput(config.concurrencyLimit, config.concurrencyLimitPath, input));
  const weighted = config.permits !== undefined || config.permitsPath !== undefined;
  const weight = weighted ? Number(fromConfigOrInput(config.permits, config.permitsPath, input)) : 1;
  const leaseSeconds = config.leaseSeconds;
  // Resumed in the user's body (or beside it, in the rate's Wait): the permit it takes again comes with a
  // body slot, in the same write, which counts against the lock's BODY_LIMIT when it records one (a rate
  // above the concurrency limit); an entry it finds is claimed only with a slot (below).
  const withSlot = needsBodySlot(resumedAt!) || needsBodySlot(states.current!);
  // Its holder id in the lock item.
  const holder = executionHolderKeyOfArn(executionArn);
  if (holder === undefined) throw new Error(`not an execution ARN: ${executionArn}`);
  // Take a permit for this run; if it holds one (its cleanup never ran, or a sweep or the event came
  // first), claim it for this run, so that nothing that judged the run before frees it. A release
  // between the tries makes the acquire worth another go.
  let gaveBack = false;
  for (let attempt = 0; attempt < 3; attempt++) {
    const now = new Date(yield* clock()).toISOString();
    let taken: boolean;
    try {
      const entry = {
        [HOLDER_ACQUIRED_AT]: now,
        [HOLDER_REDRIVE_COUNT]: redriveCount,
        ...(leaseSeconds === undefined ? {} : { [HOLDER_LEASE_SECONDS]: leaseSeconds }),
      };
      const values = { [VALUES.zero]: 0, [VALUES.one]: 1, [VALUES.limit]: limit };
      taken =
        withSlot && weight === 1
          ? yield* conditionalUpdate(config, lockName, holder, ACQUIRE_WITH_BODY_SLOT_UPDATE, ACQUIRE_WITH_BODY_SLOT_CONDITION, {
            ...values,
            [VALUES.entry]: { ...entry, [HOLDER_IN_BODY]: 1 },
          })
          : weight === 1
            ? yield* conditionalUpdate(config, lockName, holder, ACQUIRE_UPDATE, ACQUIRE_CONDITION, { ...values, [VALUES.entry]: entry })
            : yield* conditionalUpdate(config, lockName, holder, WEIGHTED_ACQUIRE_UPDATE, WEIGHTED_ACQUIRE_CONDITION, {
              ...values,
              [VALUES.weight]: weight,
              [VALUES.gate]: limit - weight,
              [VALUES.entry]: { ...entry, [HOLDER_PERMITS]: weight, [HOLDER_EXTRA_PERMITS]: weight - 1 },
            });
    } catch (e) {
      // Its own entry (see ACQUIRE_CONDITION): claim it for this run.
      if (errorName(e) !== 'ValidationException') throw e;
      const claim = {
        [VALUES.zero]: 0,
        [VALUES.one]: 1,
        [QUEUE_VALUES.claimed]: true,
        [VALUES.acquiredAt]: now,
        [VALUES.redriveCount]: redriveCount,
      };
      if (withSlot && weight === 1) {
        // Inside its body, the run needs a body slot with its permit: its entry holds one (it was
        // stopped in the body), or it takes one now (an entry a stale ticket handed it, or one taken
        // back after a lost wake-up, has none). Neither while the slots are all taken: try again.
        if (yield* conditionalUpdate(config, lockName, holder, CLAIM_UPDATE, BODY_SLOT_AND_PERMIT_HELD_CONDITION, claim)) {
          return { executionArn, resumedAt, action: 'still holds its permit' };
        }
        if (yield* conditionalUpdate(config, lockName, holder, CLAIM_WITH_BODY_SLOT_UPDATE, CLAIM_WITH_BODY_SLOT_CONDITION, claim)) {
          return { executionArn, resumedAt, action: 'still holds its permit' };
        }
        // An entry that holds a slot and no permit (a concurrency limit above the rate's count: the run
        // before gave its permit back at the interval): it takes a permit into it, since a redrive counts
        // as an acquisition, keeping its slot. Refused while every permit is taken: try again.
        const retake = { ...claim, [VALUES.limit]: limit };
        taken = yield* conditionalUpdate(config, lockName, holder, RETAKE_PERMIT_IN_SLOT_UPDATE, RETAKE_PERMIT_IN_SLOT_CONDITION, retake);
        if (!taken) continue;
      } else {
        // A weighted entry only while it holds all its permits (WEIGHTED_CLAIM_CONDITION).
        const [condition, weightValue] = weight === 1 ? [CLAIM_CONDITION, {}] : [WEIGHTED_CLAIM_CONDITION, { [VALUES.weight]: weight }];
        if (yield* conditionalUpdate(config, lockName, holder, CLAIM_UPDATE, condition, { ...claim, ...weightValue })) {
          return { executionArn, resumedAt, action: 'still holds its permit' };
        }
        // An entry of fewer permits, which the release of the stopped run is handing on one at a time:
        // give back what is left, then take the whole weight again.
        if (weight > 1) {
          const partial = { [VALUES.one]: 1, [VALUES.weight]: weight, [VALUES.redriveCount]: redriveCount };
          gaveBack = (yield* conditionalUpdate(config, lockName, holder, RELEASE_UPDATE, RELEASE_PARTIAL_CONDITION, partial)) || gaveBack;
        }
        continue;
      }
    }
    if (taken) {
      // Finished meanwhile (the event was late, the body short): give it back rather than leak it.
      const after = yield* describe(executionArn);
      if (after.status !== 'RUNNING' && after.redriveCount === redriveCount) {
        if (yield* release(config, lockName, holder, { acquiredAt: now, run: redriveCount })) yield* serveWaiters(config, lockName);
        return { executionArn, resumedAt, action: 'permit taken again, then given back' };
      }
      return { executionArn, resumedAt, action: 'permit taken again' };
    }
  }
  yield* stepFunctions('StopExecution', {
    executionArn,
    error: 'SemaphoreRedriveRejected',
    cause: `Redriven at '${resumedAt}', inside the protected body, while every permit (or body slot) of lock '${lockName}' was taken`,
  });
  // Permits it gave back on the way (an entry being handed on) go to the waiters, as a release's would.
  if (gaveBack) yield* serveWaiters(config, lockName);
  return { executionArn, resumedAt, action: 'stopped' };
}

function insideBody(state: string | undefined): boolean {
  return state !== undefined && !OUTSIDE_BODY_STATES.includes(state);
}

/**
 * From the history (newest first): the state the execution is in now, and the one its redrive
 * `run` resumed at (the last state entered before that ExecutionRedriven event). Throws
 * RedriveUndecided when the history does not show that redrive yet.
 */
function* redriveHistory(executionArn: string, run: number): Flow<{ current?: string; resumedAt?: string; superseded?: boolean }> {
  let current: string | undefined;
  let redriven = false;
  let nextToken: string | undefined;
  do {
    const page = yield* stepFunctions('GetExecutionHistory', { executionArn, reverseOrder: true, maxResults: 100, nextToken, includeExecutionData: false });
    for (const event of (page.events ?? []) as HistoryEvent[]) {
      const entered = event.stateEnteredEventDetails?.name;
      if (event.type === 'ExecutionRedriven' && !redriven) {
        const count = event.executionRedrivenEventDetails?.redriveCount;
        if (count !== undefined && count < run) throw new RedriveUndecided(`the history shows redrive ${count} as the latest, not ${run}`);
        if (count !== undefined && count > run) return { superseded: true };
        redriven = true;
      } else if (entered !== undefined) {
        if (!redriven) current ??= entered;
        else return { current: current ?? entered, resumedAt: entered };
      }
    }
    nextToken = page.nextToken;
  } while (nextToken);
  if (!redriven) throw new RedriveUndecided(`the history does not show redrive ${run} yet`);
  return { current };
}

/**
 * The stripe of a split lock that an execution drew: the lock name in the output of its "Pick Lock
 * Stripe" state, among the first states of its history (oldest first). A redrive resumes with the
 * state data, so every run of the execution uses it. Throws RedriveUndecided when the history does not
 * show it (yet: GetExecutionHistory is eventually consistent).
 */
function* drawnStripe(executionArn: string, lockName: string): Flow<string> {
  let nextToken: string | undefined;
  let read = 0;
  do {
    // Small pages first: each event carries up to 256 KiB of data, and the draw is among the first few
    // (after the idempotency's states; a duplicate that took over from a failed original draws later).
    const maxResults = read === 0 ? 8 : 100;
    const page = yield* stepFunctions('GetExecutionHistory', { executionArn, reverseOrder: false, maxResults, nextToken, includeExecutionData: true });
    for (const event of (page.events ?? []) as HistoryEvent[]) {
      const exited = event.stateExitedEventDetails;
      if (exited?.name !== STATE.pickLockStripe) continue;
      const stripe = (JSON.parse(exited.output ?? '{}') as { [LOCK_STRIPE_FIELD]?: { name?: unknown } })[LOCK_STRIPE_FIELD]?.name;
      if (typeof stripe !== 'string' || !stripe.startsWith(`${lockName}${LOCK_STRIPE_SEPARATOR}`)) {
        throw new Error(`the history of ${executionArn} shows '${String(stripe)}' drawn by ${STATE.pickLockStripe}, not a stripe of lock '${lockName}'`);
      }
      return stripe;
    }
    read += (page.events ?? []).length;
    nextToken = page.nextToken;
    // The stripe is drawn before the first acquire, which comes before the body the guard is called for.
  } while (nextToken);
  throw new RedriveUndecided(`the history does not show the stripe drawn by ${STATE.pickLockStripe} (yet)`);
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
        ...(`${update} ${condition}`.includes(NAMES.collecting) ? { [NAMES.collecting]: COLLECTING } : {}),
        ...(`${update} ${condition}`.includes(NAMES.bodies) ? { [NAMES.bodies]: BODIES_RUNNING } : {}),
        ...(`${update} ${condition}`.includes(NAMES.bodyLimit) ? { [NAMES.bodyLimit]: BODY_LIMIT } : {}),
      },
      // Every expression that reads the collector's mark compares it with zero.
      ExpressionAttributeValues: `${update} ${condition}`.includes(VALUES.zero) ? { [VALUES.zero]: 0, ...values } : values,
    });
    return true;
  } catch (e) {
    if (errorName(e) === 'ConditionalCheckFailedException') return false;
    throw e;
  }
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
