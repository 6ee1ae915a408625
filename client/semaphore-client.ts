import { randomUUID } from 'crypto';
import { AttributeValue, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SFNClient } from '@aws-sdk/client-sfn';
import { clock, dynamodb, errorName, Flow, runFlow, stepFunctions, uuid } from './effects';
import { QueueServiceResult, serveQueue } from './queue-service';
import { deleteServedTicket, readTicket, serveTicket, waitingForRate, waitingTickets } from './ticket-queue';
import {
  BODIES_RUNNING,
  BODY_LIMIT,
  CLIENT_BODY_SLOT_CONDITION,
  CLIENT_BODY_SLOT_UPDATE,
  HOLDER_IN_BODY,
  CLIENT_ACQUIRE_CONDITION,
  CLIENT_ACQUIRE_UPDATE,
  CLIENT_RATE_UPDATE,
  CLIENT_WEIGHTED_ACQUIRE_CONDITION,
  CLIENT_WEIGHTED_ACQUIRE_UPDATE,
  CLIENT_COMPLETE_COLLECTOR_CONDITION,
  CLIENT_COMPLETE_COLLECTOR_UPDATE,
  CLIENT_REGISTER_COLLECTOR_CONDITION,
  CLIENT_REGISTER_COLLECTOR_UPDATE,
  CLIENT_RENEW_COLLECTOR_CONDITION,
  CLIENT_RENEW_COLLECTOR_UPDATE,
  CLIENT_WEIGHTED_COMPLETE_COLLECTOR_UPDATE,
  CONCURRENCY_LIMIT,
  HOLDER_COLLECTING,
  HOLDER_EXTRA_PERMITS,
  HOLDER_PERMITS,
  MAX_PERMITS,
  MAX_RATE_INTERVAL_SECONDS,
  SPLIT_HAND_OFF_CONDITION,
  SPLIT_HAND_OFF_UPDATE,
  TAKE_BACK_ONE_CONDITION,
  TAKE_BACK_ONE_UPDATE,
  HOLDER_ACQUIRED_AT,
  HOLDER_LEASE_EXPIRES_AT,
  HOLDER_LEASE_SECONDS,
  executionHolderKeyOfArn,
  isExecutionHolder,
  LOCK_KEY,
  MAX_CONCURRENCY_LIMIT,
  MAX_LOCK_NAME_LENGTH,
  MAX_OWNER_LENGTH,
  NAMES,
  PERMITS_IN_USE,
  RATE_INTERVAL,
  COLLECTING,
  COLLECT_GATE,
  RELEASE_CONDITION,
  RELEASE_EXPIRED_LEASE_CONDITION,
  RELEASE_UPDATE,
  VALUES,
  FENCING_TOKEN,
  HAND_OFF_CONDITION,
  HAND_OFF_UPDATE,
  HOLDER_HANDOFF_ID,
  HOLDER_REDRIVE_COUNT,
  PEEK_CONDITION,
  PEEK_UPDATE,
  QUEUE_NAMES,
  QUEUE_VALUES,
  RELEASE_IF_NO_WAITERS_CONDITION,
  STILL_HELD_CONDITION,
  STILL_HELD_UPDATE,
  TAKE_BACK_CONDITION,
  TAKE_BACK_UPDATE,
  QUEUE_HEAD,
  QUEUE_TAIL,
  TICKET_SERVED_BY,
  TICKET_WAIT_TOKEN,
  TICKET_WAITER,
  TICKET_KEY_SEPARATOR,
} from '../src/private/lock-schema';

/*
 * The client side of the semaphore: scripts, CI jobs and operators take and give back the very same
 * permits as the workflows, with the same conditional writes (src/private/lock-schema.ts). A client
 * holder is a lease: an entry named by a lease id, with `acquiredAt` (ISO-8601), `leaseExpiresAt`
 * (epoch milliseconds) and `owner`. A lease that is not renewed expires; the next acquirer that finds
 * the lock full reclaims it (conditional on the expired entry being unchanged), and so does the
 * reconciler's sweep. Both wait `clockSkew` past the expiry first.
 *
 * A client's limit can only lower the gate: an acquire also needs a permit below the limit stored on
 * the lock item (the workflows' limit, written by each of their acquires), and records its own limit
 * there only when the lock has none yet.
 */

/** Draw a fresh fencing token for a holder that holds a permit. */
const DRAW_FENCING_TOKEN_UPDATE = `SET ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}`;

/** Lease ids start with this, so that they never look like an execution ARN. */
export const LEASE_ID_PREFIX = 'lease-';

/** Field of a client holder entry: who took it (`--owner`, by default user@host). */
export const HOLDER_OWNER = 'o';

export interface SemaphoreClientOptions {
  /** The lock table (a `SemaphoreTable`). */
  readonly tableName: string;
  /** @default - a client from the standard SDK configuration (profile, region, AWS_ENDPOINT_URL_DYNAMODB) */
  readonly dynamodb?: DynamoDBClient;
  /**
   * For waking the queue's waiters; give it `maxAttempts: 1`: a retried SendTaskSuccess that woke the waiter would hear TaskTimedOut and take its permit back.
   * @default - a client from the standard SDK configuration (AWS_ENDPOINT_URL_SFN included), one attempt per call
   */
  readonly stepFunctions?: SFNClient;
  /** How long past its end a lease counts as expired, for clock skew between machines. @default 30 */
  readonly clockSkewSeconds?: number;
  /**
   * Told when a release handed its permit to a queued execution but could not wake it (no
   * `states:SendTaskSuccess` permission, no region, a network error): the permit then sits idle until
   * that execution's `queueCheckInterval`. @default - not told
   */
  readonly onWarning?: (message: string) => void;
}

export interface AcquireOptions {
  /**
   * The concurrency limit. The limit stored on the lock (the workflows') still applies when it is
   * lower: the acquire gets in only below both.
   * @default - the limit stored on the lock, or 1
   */
  readonly limit?: number;
  /**
   * The lease: without a renewal, the permit is free again this long after the acquire. On a lock
   * with a rate (`rateIntervalSeconds`), at least the rate's interval.
   * @default 900
   */
  readonly leaseSeconds?: number;
  /**
   * The rate interval of the lock's workflows, in whole seconds (1 to 86,400), for a lock that records
   * none yet: a lock that no rate-limited execution has acquired, or one whose item was deleted to
   * upgrade. The acquire records it on such a lock, so that this lease (and every client's) holds its
   * permit for at least the interval, as an execution does: without it, the release of a lease taken
   * there gives the permit back at once, and up to the rate's count of executions can start beside it
   * within the interval. A lock that records an interval keeps it (a rate-limited workflow's acquire
   * writes its own), and that one counts.
   * @default - the interval the lock records, if any
   */
  readonly rateIntervalSeconds?: number;
  /** How long to wait for a permit; 0 tries once. @default 0 */
  readonly waitSeconds?: number;
  /** Recorded in the holder entry. @default - none */
  readonly owner?: string;
  /**
   * How many of the lock's permits to take at once (a weight), from 1 to 100 and at most the limit.
   * The release gives them all back. @default 1
   */
  readonly permits?: number;
  /** Time between attempts while waiting (jittered: half to all of it). @default 2 */
  readonly pollSeconds?: number;
  /** Stops the wait (the acquire then returns undefined). */
  readonly signal?: AbortSignal;
  /** Called after each attempt that found the lock full, before waiting for the next one. */
  readonly onWait?: (state: WaitState) => void;
  /** Called after an attempt that failed with an error that may pass (throttling, a server or network error), before the next one. */
  readonly onRetry?: (error: Error) => void;
}

export interface ReleaseOptions {
  /** Told, before the release waits, how long it holds the permit for the lock's rate (milliseconds). */
  readonly onRateHold?: (millis: number) => void;
}

/** What an acquire that has to wait saw on the lock. */
export interface WaitState {
  readonly permitsInUse: number;
  /** The limit the acquire applies: the smaller of its own and the lock's. */
  readonly limit: number;
  /** The limit stored on the lock item, if any. */
  readonly lockLimit?: number;
  /** It goes next: registered as the lock's collector, executions queued behind it (see registerCollector). */
  readonly next?: boolean;
}

export interface Lease {
  readonly lockName: string;
  readonly leaseId: string;
  /** Strictly increases with every acquisition of the lock (workflows' included): pass it to systems that must reject a stale holder. */
  readonly fencingToken?: number;
  /** Epoch milliseconds. */
  readonly expiresAt: number;
  /** The limit the acquire applied: the smaller of its own and the one stored on the lock. */
  readonly limit: number;
  /** The limit stored on the lock item after the acquire. */
  readonly lockLimit?: number;
  /** How many permits the lease holds. */
  readonly permits: number;
}

export interface HolderStatus {
  /** Execution ARN or lease id. */
  readonly id: string;
  readonly kind: 'execution' | 'lease';
  readonly owner?: string;
  readonly acquiredAt: string;
  readonly ageSeconds: number;
  /** Leases: when the lease ends, epoch milliseconds. */
  readonly leaseExpiresAt?: number;
  /** Executions with a lease: its length in seconds. */
  readonly leaseSeconds?: number;
  /** Leases: whether it ended more than the clock-skew margin ago (an acquirer may reclaim it). */
  readonly expired: boolean;
  /** How many of the lock's permits it holds (a weighted acquisition's, else 1; 0 while it collects). */
  readonly permits: number;
  /**
   * A lease that waits as the lock's collector (a client that goes next, or a weighted execution woken
   * with one of its permits): the releases give their permits to it until it has them all.
   */
  readonly collecting?: boolean;
  /**
   * On a lock with a rate: its acquire plus the rate's interval, epoch milliseconds. Until then its
   * permits stay held whether or not its work has ended. (An execution's interval runs from its body's
   * start, and again from a failure or a stop, all later than the acquire or the hand-off it records:
   * this is the earliest its permits go back.)
   */
  readonly rateHoldEndsAt?: number;
}

export interface LockStatus {
  readonly lockName: string;
  readonly permitsInUse: number;
  /** The limit stored on the lock: the last workflow acquire's (a client records its own only on a lock that has none). */
  readonly limit?: number;
  /**
   * The rate interval of the lock's rate-limited workflows (`rateLimit`), seconds: every acquisition,
   * a client's included, holds its permit at least this long, so that the rate counts it.
   */
  readonly rateIntervalSeconds?: number;
  /**
   * On a lock with a rate: the permits in use (by weight) whose acquisition is still inside the rate's
   * interval. No permit goes back before its interval ends, so while the lock is full these are the
   * permits the rate, rather than the concurrency limit, may be keeping from the waiters.
   */
  readonly permitsHeldForRate?: number;
  /**
   * On a lock with a rate: of the executions queued (`waiting`), how many the rate keeps waiting, one
   * for each permit it holds (`permitsHeldForRate`), at most all of them. The others wait for permits
   * that only running bodies or leases hold.
   */
  readonly waitingForRate?: number;
  /**
   * On a lock whose rate's count is above its workflows' concurrency limit: how many bodies may run at
   * once (each takes a body slot beside its permit, and a client lease one for as long as it holds), and
   * how many slots are taken. A holder waiting for a slot holds a permit, but its body has not started.
   */
  readonly bodyLimit?: number;
  readonly bodiesRunning?: number;
  readonly holders: HolderStatus[];
  /**
   * How many tickets wait in the lock's queue: while there are any, every permit given back goes to
   * their executions, unless a collector (a client that waits, or a weighted execution) is short of permits.
   */
  readonly waiting: number;
  /** The executions of the oldest waiting tickets (at most STATUS_WAITERS), oldest first. */
  readonly waiters: string[];
}

/** How many of the oldest waiters `status` names (one read each). */
export const STATUS_WAITERS = 20;

/** A client of the semaphore table, sharing permits with the workflows. */
export class SemaphoreClient {
  private readonly ddb: DynamoDBClient;
  private readonly sfn: SFNClient;
  private readonly tableName: string;
  private readonly skewMillis: number;
  private readonly warn: (message: string) => void;

  constructor(options: SemaphoreClientOptions) {
    if (!options.tableName) throw new Error('a table name is required');
    this.tableName = options.tableName;
    this.ddb = options.dynamodb ?? new DynamoDBClient({});
    // One attempt: a retried SendTaskSuccess that did wake the waiter hears TaskTimedOut, and would take
    // back the permit the waiter is using. A failed call is a lost wake-up, which the waiter recovers.
    this.sfn = options.stepFunctions ?? new SFNClient({ maxAttempts: 1 });
    this.skewMillis = (options.clockSkewSeconds ?? 30) * 1000;
    this.warn = options.onWarning ?? (() => undefined);
  }

  /** Take a permit; undefined when none became free within the wait. */
  public async acquire(lockName: string, options: AcquireOptions = {}): Promise<Lease | undefined> {
    validLockName(lockName);
    positive('leaseSeconds', options.leaseSeconds ?? 900);
    const waitSeconds = options.waitSeconds ?? 0;
    if (!(waitSeconds >= 0)) throw new Error(`the wait must be 0 or more seconds, got: ${waitSeconds}`);
    const pollMillis = (options.pollSeconds ?? 2) * 1000;
    const deadline = Date.now() + waitSeconds * 1000;
    let limit = options.limit;
    if (limit !== undefined && (!Number.isInteger(limit) || limit < 1 || limit > MAX_CONCURRENCY_LIMIT)) {
      throw new Error(`the limit must be an integer from 1 to ${MAX_CONCURRENCY_LIMIT} (the holders share one item of at most 400 KB), got: ${limit}`);
    }
    if (options.owner !== undefined && Buffer.byteLength(options.owner, 'utf8') > MAX_OWNER_LENGTH) {
      throw new Error(`the owner must be at most ${MAX_OWNER_LENGTH} bytes long (UTF-8), got ${Buffer.byteLength(options.owner, 'utf8')}`);
    }
    const permits = options.permits ?? 1;
    if (!Number.isInteger(permits) || permits < 1 || permits > MAX_PERMITS) {
      throw new Error(`the permits must be an integer from 1 to ${MAX_PERMITS}, got: ${permits}`);
    }
    const rateIntervalSeconds = options.rateIntervalSeconds;
    const wholeSecondsUpToADay = (n: number) => Number.isInteger(n) && n >= 1 && n <= MAX_RATE_INTERVAL_SECONDS;
    if (rateIntervalSeconds !== undefined && !wholeSecondsUpToADay(rateIntervalSeconds)) {
      throw new Error(`rateIntervalSeconds must be a whole number of seconds from 1 to ${MAX_RATE_INTERVAL_SECONDS} (one day), got: ${rateIntervalSeconds}`);
    }
    // The lock's limit when none is given, and its rate: a lease never ends before the rate's interval.
    const lock = await this.run(getItem(this.tableName, lockName));
    const lockLimit = numberOf(lock?.[CONCURRENCY_LIMIT]);
    limit ??= lockLimit ?? 1;
    // A weighted acquire applies the smaller limit itself (see CLIENT_WEIGHTED_ACQUIRE_CONDITION).
    if (permits > 1 && lockLimit !== undefined) limit = Math.min(limit, lockLimit);
    if (permits > limit) throw new Error(`the permits (${permits}) must be at most the limit (${limit}): they could never all be free`);
    // The interval the lock records wins: the acquire records the given one only where none is.
    const leaseSeconds = Math.max(options.leaseSeconds ?? 900, numberOf(lock?.[RATE_INTERVAL]) ?? rateIntervalSeconds ?? 0);
    const leaseId = `${LEASE_ID_PREFIX}${randomUUID()}`;
    const protocol = this.protocol();
    // Registered as the lock's collector (it goes next: see registerCollector), under this limit.
    let collecting: number | undefined;
    const registrationSeconds = Math.max(COLLECTOR_LEASE_SECONDS, Math.ceil((3 * pollMillis) / 1000));
    // A wait that ends while registered gives the registration (and whatever it collected) up.
    const giveUp = async (): Promise<void> => {
      if (collecting === undefined) return;
      collecting = undefined;
      await this.run(abandonCollecting(protocol, lockName, leaseId)).catch((e) => this.warn(`could not give up waiting as the collector of ${lockName}: ${e}`));
    };
    try {
      for (;;) {
        const attempt: AcquireAttempt & CollectAttempt =
          collecting === undefined
            ? await this.run(acquireAttempt(protocol, lockName, leaseId, { limit, leaseSeconds, owner: options.owner, permits, rateIntervalSeconds }))
            : await this.run(completeCollecting(protocol, lockName, leaseId, { limit: collecting, leaseSeconds, permits, registrationSeconds }));
        if (attempt.lease) {
          // Permits given back beyond what it needed as the collector (a weighted execution giving its
          // handed permit back) go to the queue's waiters; best effort: it holds its own.
          if (collecting !== undefined) await this.run(serveQuietly(protocol, lockName));
          return attempt.lease;
        }
        if (attempt.gone) collecting = undefined;
        const seen = numberOf(attempt.item?.[CONCURRENCY_LIMIT]);
        // A registration whose response was lost (or one it could not give up): collect under the limit
        // its gate came from (the gate is that limit less the permits).
        if (attempt.collecting) collecting = (numberOf(attempt.item?.[COLLECT_GATE]) ?? Math.min(limit, seen ?? limit) - permits) + permits;
        // The lock's limit was lowered below the one the registration's gate came from: register again.
        if (collecting !== undefined && seen !== undefined && seen < collecting) await giveUp();
        // The lock's limit was lowered since it was read: a weighted acquire then applies it.
        if (collecting === undefined && permits > 1 && seen !== undefined && seen < limit) {
          if (permits > seen) throw new Error(`the permits (${permits}) are more than the lock's limit (${seen}): they could never all be free`);
          limit = seen;
          continue;
        }
        if (attempt.reclaimed || attempt.gone) continue;
        // A failed call ends the acquire unless it may pass (throttling, a server or network error) and
        // there is time left to try again.
        if (attempt.failure !== undefined) {
          const left = deadline - Date.now();
          if (!isTransient(attempt.failure) || left <= 0 || options.signal?.aborted) throw attempt.failure;
          options.onRetry?.(attempt.failure as Error);
          await sleep(Math.min(left, pollMillis / 2 + Math.random() * (pollMillis / 2)), options.signal);
          continue;
        }
        const remaining = deadline - Date.now();
        if (remaining <= 0 || options.signal?.aborted) {
          await giveUp();
          return undefined;
        }
        // Executions queue on the lock: go next rather than poll beside a queue that takes every permit
        // (not under a limit of its own below the lock's: its gate would hold every hand-off until the lock drained).
        if (collecting === undefined && (seen === undefined || limit >= seen) && shouldCollect(attempt.item)) {
          const gateLimit = Math.min(limit, seen ?? limit);
          try {
            const registration = { limit: gateLimit, owner: options.owner, permits, registrationSeconds };
            if (await this.run(registerCollector(protocol, lockName, leaseId, registration))) {
              collecting = gateLimit;
              continue;
            }
          } catch (e) {
            // Perhaps registered (a lost response): the next attempt finds the entry and collects.
            if (!isTransient(e)) throw e;
            options.onRetry?.(e as Error);
          }
        }
        options.onWait?.({
          permitsInUse: Number(attempt.item?.[PERMITS_IN_USE]?.N ?? 0),
          ...limits(limit, attempt.item),
          ...(collecting === undefined ? {} : { next: true }),
        });
        await sleep(Math.min(remaining, pollMillis / 2 + Math.random() * (pollMillis / 2)), options.signal);
      }
    } catch (e) {
      await giveUp();
      throw e;
    }
  }

  /**
   * Extend a lease to `leaseSeconds` from now: its new end (epoch ms), or undefined when it is not held
   * (any more). On a lock with a rate, never to before the rate's interval has passed since the acquire.
   */
  public async renew(lockName: string, leaseId: string, leaseSeconds = 900): Promise<number | undefined> {
    validLockName(lockName);
    positive('leaseSeconds', leaseSeconds);
    notAnExecution(leaseId);
    const expiresAt = Math.max(Date.now() + leaseSeconds * 1000, (await this.rateHoldEnd(lockName, leaseId)) ?? 0);
    const renewed = await this.run(
      conditionalUpdate(this.tableName, lockName, leaseId, `SET ${NAMES.holder}.${HOLDER_LEASE_EXPIRES_AT} = ${VALUES.expiresAt}`, RELEASE_CONDITION, {
        [VALUES.expiresAt]: { N: String(expiresAt) },
      }),
    );
    return renewed ? expiresAt : undefined;
  }

  /**
   * Give a lease's permit back; false when it is not held (any more). An execution's permit needs
   * forceRelease. On a lock with a rate, it first waits until the rate's interval has passed since the
   * acquire (and tells `onRateHold` how many milliseconds).
   */
  public async release(lockName: string, leaseId: string, options: ReleaseOptions = {}): Promise<boolean> {
    validLockName(lockName);
    notAnExecution(leaseId);
    const left = ((await this.rateHoldEnd(lockName, leaseId)) ?? 0) - Date.now();
    if (left > 0) {
      options.onRateHold?.(left);
      await sleep(left);
    }
    return this.run(releaseHolder(this.protocol(), lockName, leaseId, await this.isWeighted(lockName, leaseId)));
  }

  /**
   * Free the permit of any holder, an execution included (which keeps running: stop it first), by
   * its holder id or an execution's ARN. For operators; false when the holder holds nothing.
   */
  public async forceRelease(lockName: string, holder: string): Promise<boolean> {
    validLockName(lockName);
    // An execution ARN names the execution's holder id; a version before the short keys keyed it by the ARN.
    const key = executionHolderKeyOfArn(holder);
    const id = key !== undefined && (await this.run(getItem(this.tableName, lockName)))?.[holder] === undefined ? key : holder;
    const released = await this.run(releaseHolder(this.protocol(), lockName, id, await this.isWeighted(lockName, id)));
    // A collector's entry goes without a hand-off: what was given back to it goes to the queue.
    if (released) await this.run(serveQuietly(this.protocol(), lockName));
    return released;
  }

  /** Whether a holder's entry holds more than one permit (its release then hands them on one at a time). */
  private async isWeighted(lockName: string, holder: string): Promise<boolean> {
    const lock = await this.run(getItem(this.tableName, lockName));
    return (numberOf(lock?.[holder]?.M?.[HOLDER_EXTRA_PERMITS]) ?? 0) > 0;
  }

  /** The lock's holders, their ages and leases, the count and the last limit. */
  public async status(lockName: string): Promise<LockStatus> {
    validLockName(lockName);
    const item = await this.run(getItem(this.tableName, lockName));
    const now = Date.now();
    const rateSeconds = numberOf(item?.[RATE_INTERVAL]);
    const holders: HolderStatus[] = [];
    for (const [id, value] of Object.entries(item ?? {})) {
      const entry = value.M;
      if (!entry?.[HOLDER_ACQUIRED_AT]?.S) continue;
      const acquiredAt = entry[HOLDER_ACQUIRED_AT].S;
      const leaseExpiresAt = entry[HOLDER_LEASE_EXPIRES_AT]?.N === undefined ? undefined : Number(entry[HOLDER_LEASE_EXPIRES_AT].N);
      holders.push({
        id,
        kind: isExecutionHolder(id) ? 'execution' : 'lease',
        owner: entry[HOLDER_OWNER]?.S,
        acquiredAt,
        ageSeconds: Math.max(0, Math.round((now - Date.parse(acquiredAt)) / 1000)),
        leaseExpiresAt,
        leaseSeconds: entry[HOLDER_LEASE_SECONDS]?.N === undefined ? undefined : Number(entry[HOLDER_LEASE_SECONDS].N),
        expired: !isExecutionHolder(id) && leaseExpiresAt !== undefined && leaseExpiresAt + this.skewMillis < now,
        permits: numberOf(entry[HOLDER_PERMITS]) ?? 1,
        ...(entry[HOLDER_COLLECTING] === undefined ? {} : { collecting: true }),
        rateHoldEndsAt: rateHoldEndOf(entry, rateSeconds),
      });
    }
    holders.sort((a, b) => a.acquiredAt.localeCompare(b.acquiredAt));
    const queue = waitingTickets(item);
    const waiting = Math.max(0, queue.tail - queue.head);
    const waiters: string[] = [];
    for (let ticket = queue.head + 1; ticket <= Math.min(queue.tail, queue.head + STATUS_WAITERS); ticket++) {
      const ticketItem = await this.run(readTicket(this.tableName, lockName, ticket));
      const id = ticketItem?.[TICKET_WAITER]?.S;
      if (id !== undefined && ticketItem?.[TICKET_SERVED_BY] === undefined) waiters.push(id);
    }
    return {
      lockName,
      permitsInUse: Number(item?.[PERMITS_IN_USE]?.N ?? 0),
      limit: item?.[CONCURRENCY_LIMIT]?.N === undefined ? undefined : Number(item[CONCURRENCY_LIMIT].N),
      ...(rateSeconds === undefined ? {} : rateStatus(rateSeconds, holders, now, waiting)),
      ...(item?.[BODY_LIMIT] === undefined ? {} : { bodyLimit: numberOf(item[BODY_LIMIT]), bodiesRunning: numberOf(item[BODIES_RUNNING]) ?? 0 }),
      holders,
      waiting,
      waiters,
    };
  }

  /** On a lock with a rate: when the rate's interval ends for a lease's acquire (epoch ms); else undefined. */
  private async rateHoldEnd(lockName: string, leaseId: string): Promise<number | undefined> {
    const lock = await this.run(getItem(this.tableName, lockName));
    return rateHoldEndOf(lock?.[leaseId]?.M, numberOf(lock?.[RATE_INTERVAL]));
  }

  private protocol(): ClientProtocolOptions {
    return { tableName: this.tableName, clockSkewMs: this.skewMillis, onWakeUpLost: this.wakeUpLost };
  }

  private run<T>(flow: Flow<T>): Promise<T> {
    return runFlow(flow, { dynamodb: this.ddb, stepFunctions: this.sfn });
  }

  private readonly wakeUpLost = (waiter: string, error: Error) =>
    this.warn(
      `handed the permit to the queued execution ${waiter} but could not wake it (${error.name}: ${String(error.message).split('\n')[0]}); ` +
        'it finds the permit when its queueCheckInterval ends (is states:SendTaskSuccess allowed? see SemaphoreTable.grantClient)',
    );
}

/** A rate-limited lock's part of its status: the interval, the permits the rate holds at `now`, the waiters it keeps. */
function rateStatus(rateIntervalSeconds: number, holders: HolderStatus[], now: number, waiting: number) {
  const permitsHeldForRate = holders.filter((h) => h.rateHoldEndsAt! > now).reduce((sum, h) => sum + h.permits, 0);
  return { rateIntervalSeconds, permitsHeldForRate, waitingForRate: waitingForRate(waiting, permitsHeldForRate) };
}

/*
 * The client's side of the lock protocol, as flows (client/effects.ts): the class above runs them
 * against AWS, the protocol checker (checker/) step by step in its model.
 */

/** What the client's flows need. */
export interface ClientProtocolOptions {
  readonly tableName: string;
  /** How long past its end a lease counts as expired, milliseconds. */
  readonly clockSkewMs: number;
  /** Told when a release handed its permit to a queued execution but could not wake it. */
  readonly onWakeUpLost?: (waiter: string, error: Error) => void;
}

/** What one acquire attempt came to. */
export interface AcquireAttempt {
  /** The permit, taken by this attempt (or by an earlier one whose response was lost). */
  readonly lease?: Lease;
  /** The write failed, and it is not ours: the caller decides whether to try again. */
  readonly failure?: unknown;
  /** Expired leases were freed: worth trying again at once. */
  readonly reclaimed?: boolean;
  /** The lock as the attempt saw it, when it was full. */
  readonly item?: Record<string, AttributeValue>;
  /** The lease id is registered as the lock's collector (a registration whose response was lost). */
  readonly collecting?: boolean;
}

/**
 * One attempt to take a permit under `leaseId`: the conditional write; when it is refused or fails,
 * a look at the lock (the write may have landed) and the reclaim of expired leases.
 */
export function* acquireAttempt(
  options: ClientProtocolOptions,
  lockName: string,
  leaseId: string,
  request: {
    readonly limit: number;
    readonly leaseSeconds: number;
    readonly owner?: string;
    readonly permits?: number;
    /** Recorded on a lock that records no rate interval (see AcquireOptions.rateIntervalSeconds). */
    readonly rateIntervalSeconds?: number;
  },
): Flow<AcquireAttempt> {
  const permits = request.permits ?? 1;
  const rate = request.rateIntervalSeconds;
  const now = yield* clock();
  const expiresAt = now + request.leaseSeconds * 1000;
  const entry: Record<string, AttributeValue> = {
    [HOLDER_ACQUIRED_AT]: { S: new Date(now).toISOString() },
    [HOLDER_LEASE_EXPIRES_AT]: { N: String(expiresAt) },
    ...(request.owner ? { [HOLDER_OWNER]: { S: request.owner } } : {}),
    ...(permits > 1 ? { [HOLDER_PERMITS]: { N: String(permits) }, [HOLDER_EXTRA_PERMITS]: { N: String(permits - 1) } } : {}),
    // A lease takes a body slot too, which counts only on a lock that records a BODY_LIMIT.
    [HOLDER_IN_BODY]: { N: '1' },
  };
  let taken: Record<string, AttributeValue> | undefined;
  let failure: unknown;
  try {
    taken = yield* conditionalUpdate(
      options.tableName,
      lockName,
      leaseId,
      `${permits > 1 ? CLIENT_WEIGHTED_ACQUIRE_UPDATE : CLIENT_ACQUIRE_UPDATE}, ${CLIENT_BODY_SLOT_UPDATE}${rate === undefined ? '' : `, ${CLIENT_RATE_UPDATE}`}`,
      `(${permits > 1 ? CLIENT_WEIGHTED_ACQUIRE_CONDITION : CLIENT_ACQUIRE_CONDITION}) AND ${CLIENT_BODY_SLOT_CONDITION}`,
      {
        [VALUES.zero]: { N: '0' },
        [VALUES.one]: { N: '1' },
        [VALUES.limit]: { N: String(request.limit) },
        [VALUES.entry]: { M: entry },
        ...(permits > 1 ? { [VALUES.weight]: { N: String(permits) }, [VALUES.gate]: { N: String(request.limit - permits) } } : {}),
        ...(rate === undefined ? {} : { [VALUES.rate]: { N: String(rate) } }),
      },
      'UPDATED_NEW',
    );
  } catch (e) {
    // The write may have landed although the call failed (after the SDK's own retries): look below.
    failure = e;
  }
  if (taken) {
    return { lease: { lockName, leaseId, expiresAt, fencingToken: numberOf(taken[FENCING_TOKEN]), permits, ...limits(request.limit, taken) } };
  }

  // Full, or the call failed: look (our write may have landed), and reclaim expired leases.
  const item = yield* getItem(options.tableName, lockName);
  const ours = item?.[leaseId]?.M;
  // Its registration as the lock's collector (a write whose response was lost): it holds nothing yet.
  if (ours?.[HOLDER_COLLECTING] !== undefined) return { item, collecting: true };
  if (ours) return { lease: yield* ownLease(options, lockName, leaseId, ours, request.limit, item) };
  if (failure !== undefined) return { failure };
  if (item && (yield* reclaimExpired(options, lockName, item)) > 0) {
    // Permits freed this way go to the lock's waiters first, as a release would hand them over.
    const queue = waitingTickets(item);
    if (queue.head < queue.tail) {
      yield* serveQueue({ tableName: options.tableName, onWakeUpLost: options.onWakeUpLost }, lockName);
    }
    return { reclaimed: true };
  }
  return { item };
}

/** Its own entry, taken by a write whose response was lost: a lease with a fresh fencing token. */
function* ownLease(
  options: ClientProtocolOptions,
  lockName: string,
  leaseId: string,
  ours: Record<string, AttributeValue>,
  limit: number,
  item: Record<string, AttributeValue> | undefined,
): Flow<Lease> {
  const counter = { [VALUES.zero]: { N: '0' }, [VALUES.one]: { N: '1' } };
  const drawn = yield* conditionalUpdate(options.tableName, lockName, leaseId, DRAW_FENCING_TOKEN_UPDATE, RELEASE_CONDITION, counter, 'UPDATED_NEW');
  const fencingToken = numberOf(drawn?.[FENCING_TOKEN]);
  const heldPermits = numberOf(ours[HOLDER_PERMITS]) ?? 1;
  return { lockName, leaseId, expiresAt: Number(ours[HOLDER_LEASE_EXPIRES_AT]?.N), fencingToken, permits: heldPermits, ...limits(limit, item) };
}

/*
 * A client that waits on a lock whose executions queue goes next (lock-schema.ts,
 * CLIENT_REGISTER_COLLECTOR): it registers as the lock's collector, the releases give their permits
 * back to it instead of handing them on, and it completes once enough are free. One collector at a
 * time: a client that finds another collecting polls as before.
 */

/**
 * How long a client's registration as collector lasts, seconds (at least three of its polls): each look
 * renews it once half has passed, so a client that crashed while registered holds the queue up at most
 * this long (and the clock skew) until an acquirer or the reconciler's sweep reclaims it.
 */
export const COLLECTOR_LEASE_SECONDS = 60;

/** Whether a client that waits should register as the lock's collector: executions queue, nobody collects, and no body limit is recorded (a client takes a body slot with its permits, which a collection does not wait for). */
export function shouldCollect(item: Record<string, AttributeValue> | undefined): boolean {
  const { head, tail } = waitingTickets(item);
  return item !== undefined && head < tail && !(Number(item[COLLECTING]?.N ?? '0') > 0) && item[BODY_LIMIT] === undefined;
}

/** Register `leaseId` as the lock's collector of `permits` under `limit` (the smaller of the client's and the lock's); false when refused. */
export function* registerCollector(
  options: ClientProtocolOptions,
  lockName: string,
  leaseId: string,
  request: { readonly limit: number; readonly owner?: string; readonly permits?: number; readonly registrationSeconds?: number },
): Flow<boolean> {
  const now = yield* clock();
  const entry: Record<string, AttributeValue> = {
    [HOLDER_ACQUIRED_AT]: { S: new Date(now).toISOString() },
    [HOLDER_LEASE_EXPIRES_AT]: { N: String(now + (request.registrationSeconds ?? COLLECTOR_LEASE_SECONDS) * 1000) },
    ...(request.owner ? { [HOLDER_OWNER]: { S: request.owner } } : {}),
    [HOLDER_PERMITS]: { N: '0' },
    [HOLDER_COLLECTING]: { N: '1' },
  };
  const values = { [VALUES.one]: { N: '1' }, [VALUES.gate]: { N: String(request.limit - (request.permits ?? 1)) }, [VALUES.entry]: { M: entry } };
  const update = CLIENT_REGISTER_COLLECTOR_UPDATE;
  return (yield* conditionalUpdate(options.tableName, lockName, leaseId, update, CLIENT_REGISTER_COLLECTOR_CONDITION, values)) !== undefined;
}

/** What one look of a registered collector came to. */
export interface CollectAttempt {
  /** Complete: the permits, and the lease. */
  readonly lease?: Lease;
  /** The write failed, and it is not ours: the caller decides whether to try again. */
  readonly failure?: unknown;
  /** The registration is gone (reclaimed once its lease had expired): start again. */
  readonly gone?: boolean;
  /** Expired leases were freed: worth looking again at once. */
  readonly reclaimed?: boolean;
  /** The lock as the look saw it, while still short. */
  readonly item?: Record<string, AttributeValue>;
}

/**
 * One look of a registered collector: complete if enough permits are free; else look at the lock (the
 * write may have landed), renew the registration once half its lease has passed, and reclaim expired
 * leases (their permits are the collector's).
 */
export function* completeCollecting(
  options: ClientProtocolOptions,
  lockName: string,
  leaseId: string,
  request: { readonly limit: number; readonly leaseSeconds: number; readonly permits?: number; readonly registrationSeconds?: number },
): Flow<CollectAttempt> {
  const permits = request.permits ?? 1;
  const registrationMs = (request.registrationSeconds ?? COLLECTOR_LEASE_SECONDS) * 1000;
  const now = yield* clock();
  const expiresAt = now + request.leaseSeconds * 1000;
  let failure: unknown;
  try {
    const done = yield* conditionalUpdate(
      options.tableName,
      lockName,
      leaseId,
      permits > 1 ? CLIENT_WEIGHTED_COMPLETE_COLLECTOR_UPDATE : CLIENT_COMPLETE_COLLECTOR_UPDATE,
      CLIENT_COMPLETE_COLLECTOR_CONDITION,
      {
        [VALUES.one]: { N: '1' },
        [VALUES.weight]: { N: String(permits) },
        ...(permits > 1 ? { [VALUES.extra]: { N: String(permits - 1) } } : {}),
        [VALUES.limit]: { N: String(request.limit) },
        [VALUES.acquiredAt]: { S: new Date(now).toISOString() },
        [VALUES.expiresAt]: { N: String(expiresAt) },
      },
      'UPDATED_NEW',
    );
    if (done) {
      return { lease: { lockName, leaseId, expiresAt, fencingToken: numberOf(done[FENCING_TOKEN]), permits, ...limits(request.limit, done) } };
    }
  } catch (e) {
    failure = e;
  }
  try {
    const item = yield* getItem(options.tableName, lockName);
    const ours = item?.[leaseId]?.M;
    if (ours && ours[HOLDER_COLLECTING] === undefined) return { lease: yield* ownLease(options, lockName, leaseId, ours, request.limit, item) };
    if (!ours) return { gone: true, item };
    // Renewed after a failed look too, so that a throttled lock does not let the registration lapse.
    if (Number(ours[HOLDER_LEASE_EXPIRES_AT]?.N) - now < registrationMs / 2) {
      const renewal = { [VALUES.expiresAt]: { N: String(now + registrationMs) } };
      const [update, condition] = [CLIENT_RENEW_COLLECTOR_UPDATE, CLIENT_RENEW_COLLECTOR_CONDITION];
      const renewed = yield* conditionalUpdate(options.tableName, lockName, leaseId, update, condition, renewal);
      if (!renewed) return { gone: true, item };
    }
    if (failure !== undefined) return { failure };
    if (item && (yield* reclaimExpired(options, lockName, item)) > 0) {
      // What it does not need goes to the queue (serveQueue admits only beyond the collector's gate).
      yield* serveQueue({ tableName: options.tableName, onWakeUpLost: options.onWakeUpLost }, lockName);
      return { reclaimed: true };
    }
    return { item };
  } catch (e) {
    return { failure: e };
  }
}

/** Serve the lock's queue, ignoring a failure: the caller's own result stands, and the waiters' checks recover. */
function* serveQuietly(options: ClientProtocolOptions, lockName: string): Flow<void> {
  try {
    yield* serveQueue({ tableName: options.tableName, onWakeUpLost: options.onWakeUpLost }, lockName);
  } catch {
    // A waiter finds a free permit when its queueCheckInterval ends, or the sweep serves it.
  }
}

/**
 * A collector gives up (its wait ended): its entry goes with RELEASE_UPDATE (no permit, or all of them
 * if a completion landed unseen), taking the lock's mark with it, and the permits given back to it go to
 * the queue's waiters. What serving the queue did, or undefined when it had no entry.
 */
export function* abandonCollecting(options: ClientProtocolOptions, lockName: string, leaseId: string): Flow<QueueServiceResult | undefined> {
  if (!(yield* conditionalUpdate(options.tableName, lockName, leaseId, RELEASE_UPDATE, RELEASE_CONDITION, { [VALUES.one]: { N: '1' } }))) return undefined;
  return yield* serveQueue({ tableName: options.tableName, onWakeUpLost: options.onWakeUpLost }, lockName);
}

/**
 * Give a permit back as the workflows do: when executions wait in the lock's queue, hand it to the
 * oldest (the holder entry moves to it) and wake it with SendTaskSuccess; a waiter whose task is
 * gone gets it taken back and passed on. True when the holder held a permit. A `weighted` holder (an
 * entry of several permits) hands them to the waiters one at a time (SPLIT_HAND_OFF), and gives back
 * what is left once nobody waits; from a waiter whose task is gone it takes that permit back (TAKE_BACK_ONE).
 */
export function* releaseHolder(options: ClientProtocolOptions, lockName: string, holder: string, weighted = false): Flow<boolean> {
  const table = options.tableName;
  // Leases carry no run; an execution's permit is freed whatever run took it.
  const run = { [VALUES.redriveCount]: { N: String(Number.MAX_SAFE_INTEGER) } };
  const one = { [VALUES.one]: { N: '1' } };
  const release = () => conditionalUpdate(table, lockName, holder, RELEASE_UPDATE, RELEASE_IF_NO_WAITERS_CONDITION, { ...one, ...run });
  let held = false;
  // When the queue is known to be non-empty (a ticket was passed, a waiter came after an empty peek),
  // look at it at once rather than try a release it refuses, as the workflows do.
  let peekFirst = false;
  for (let attempt = 0; attempt < 1000; attempt++) {
    if (!peekFirst && (yield* release())) return true;
    peekFirst = false;
    const peeked = yield* conditionalUpdate(table, lockName, holder, PEEK_UPDATE, PEEK_CONDITION, { ...run, ...one }, 'UPDATED_NEW');
    if (!peeked) {
      // Not held (any more), or the queue emptied meanwhile (and may have filled again since: a
      // release that ignored the queue would leave such a waiter asleep beside a free permit).
      if (yield* release()) return true;
      if (!(yield* conditionalUpdate(table, lockName, holder, STILL_HELD_UPDATE, STILL_HELD_CONDITION, run))) return held;
      peekFirst = true;
      continue;
    }
    // The ticket this release claimed.
    const ticket = Number(peeked[QUEUE_HEAD]?.N);
    const handoffId = yield* uuid();
    const served = yield* serveTicket(table, lockName, ticket, handoffId);
    const waiter = served?.[TICKET_WAITER]?.S;
    if (waiter === undefined) {
      // Nobody waits on it (skipped: its waiter is on its way, or it is an orphan): claim the next.
      peekFirst = true;
      continue;
    }
    const waiterRun = served?.[HOLDER_REDRIVE_COUNT]?.N ?? '0';
    const now = yield* clock();
    const handOffValues = {
      ...run,
      ...one,
      [VALUES.zero]: { N: '0' },
      [VALUES.entry]: {
        M: {
          [HOLDER_ACQUIRED_AT]: { S: new Date(now).toISOString() },
          [HOLDER_REDRIVE_COUNT]: { N: waiterRun },
          [HOLDER_LEASE_SECONDS]: { N: served?.[HOLDER_LEASE_SECONDS]?.N ?? '0' },
          [HOLDER_HANDOFF_ID]: { S: handoffId },
        },
      },
    };
    if (weighted) {
      // One of several permits: the waiter gets it, the holder keeps the rest and releases again.
      let split: Record<string, AttributeValue> | undefined;
      try {
        split = yield* conditionalUpdate(table, lockName, holder, SPLIT_HAND_OFF_UPDATE, SPLIT_HAND_OFF_CONDITION, handOffValues, 'UPDATED_OLD', waiter);
      } catch (e) {
        if (errorName(e) !== 'ValidationException') throw e;
      }
      if (split) {
        held = true;
        try {
          const output = JSON.stringify({ fencingToken: Number(split[FENCING_TOKEN]?.N) + 1 });
          yield* stepFunctions('SendTaskSuccess', { taskToken: served?.[TICKET_WAIT_TOKEN]?.S, output });
          yield* deleteServedTicket(table, lockName, ticket, handoffId);
        } catch (e) {
          if (['TaskTimedOut', 'TaskDoesNotExist', 'InvalidToken'].includes(errorName(e))) {
            // The waiter's task is gone: take the permit back into this entry (unless it claimed it).
            const takeBack = { [QUEUE_VALUES.handoffId]: { S: handoffId }, ...one, ...run };
            yield* conditionalUpdate(table, lockName, holder, TAKE_BACK_ONE_UPDATE, TAKE_BACK_ONE_CONDITION, takeBack, 'NONE', waiter);
          } else {
            // Not delivered: the waiter finds the permit when its wait times out.
            options.onWakeUpLost?.(waiter, e as Error);
          }
        }
        continue;
      }
    }
    let handedOff: Record<string, AttributeValue> | undefined;
    try {
      handedOff = yield* conditionalUpdate(table, lockName, holder, HAND_OFF_UPDATE, HAND_OFF_CONDITION, handOffValues, 'UPDATED_OLD', waiter);
    } catch (e) {
      if (errorName(e) !== 'ValidationException') throw e;
    }
    if (!handedOff) {
      // Its waiter holds a permit already (it found one by polling), or ours is gone: claim the next.
      peekFirst = true;
      continue;
    }
    held = true;
    try {
      // The hand-off drew the waiter's fencing token: the counter before it, plus one.
      const output = JSON.stringify({ fencingToken: Number(handedOff[FENCING_TOKEN]?.N) + 1 });
      yield* stepFunctions('SendTaskSuccess', { taskToken: served?.[TICKET_WAIT_TOKEN]?.S, output });
      yield* deleteServedTicket(table, lockName, ticket, handoffId);
      return true;
    } catch (e) {
      const name = errorName(e);
      if (!['TaskTimedOut', 'TaskDoesNotExist', 'InvalidToken'].includes(name)) {
        // Not delivered: a lost wake-up, which the waiter finds when its wait times out.
        options.onWakeUpLost?.(waiter, e as Error);
        return true;
      }
    }
    // The waiter's task is gone: take the permit back (unless it claimed it meanwhile) and hand it on.
    const later = yield* clock();
    yield* conditionalUpdate(
      table,
      lockName,
      holder,
      TAKE_BACK_UPDATE,
      TAKE_BACK_CONDITION,
      {
        [QUEUE_VALUES.handoffId]: { S: handoffId },
        // A short lease: should this client stop before it hands the permit on, it expires soon.
        [VALUES.entry]: {
          M: { [HOLDER_ACQUIRED_AT]: { S: new Date(later).toISOString() }, [HOLDER_LEASE_EXPIRES_AT]: { N: String(later + 60_000) } },
        },
      },
      'NONE',
      waiter,
    );
  }
  return held;
}

/** Release every lease of the item that ended more than the skew ago; how many were freed. */
function* reclaimExpired(options: ClientProtocolOptions, lockName: string, item: Record<string, AttributeValue>): Flow<number> {
  const now = yield* clock();
  let freed = 0;
  for (const [id, value] of Object.entries(item)) {
    const expiresAt = value.M?.[HOLDER_LEASE_EXPIRES_AT]?.N;
    if (isExecutionHolder(id) || !value.M?.[HOLDER_ACQUIRED_AT] || expiresAt === undefined) continue;
    if (Number(expiresAt) + options.clockSkewMs >= now) continue;
    // Conditional on the lease we saw: one renewed meanwhile is left alone.
    const values = { [VALUES.one]: { N: '1' }, [VALUES.expiresAt]: { N: expiresAt } };
    if (yield* conditionalUpdate(options.tableName, lockName, id, RELEASE_UPDATE, RELEASE_EXPIRED_LEASE_CONDITION, values)) {
      freed++;
    }
  }
  return freed;
}

function* getItem(tableName: string, lockName: string): Flow<Record<string, AttributeValue> | undefined> {
  const out = yield* dynamodb('GetItem', { TableName: tableName, Key: { [LOCK_KEY]: { S: lockName } }, ConsistentRead: true });
  return out.Item;
}

/** A conditional write on a holder's behalf: the attributes it returns, or undefined when its condition failed. */
function* conditionalUpdate(
  tableName: string,
  lockName: string,
  holder: string,
  update: string,
  condition: string,
  values: Record<string, AttributeValue>,
  returnValues: 'NONE' | 'UPDATED_NEW' | 'UPDATED_OLD' = 'NONE',
  next?: string,
): Flow<Record<string, AttributeValue> | undefined> {
  const expressions = `${update} ${condition}`;
  try {
    const out = yield* dynamodb('UpdateItem', {
      TableName: tableName,
      Key: { [LOCK_KEY]: { S: lockName } },
      UpdateExpression: update,
      ConditionExpression: condition,
      ExpressionAttributeNames: {
        ...(expressions.includes(NAMES.holder) ? { [NAMES.holder]: holder } : {}),
        ...(expressions.includes(NAMES.permits) ? { [NAMES.permits]: PERMITS_IN_USE } : {}),
        ...(expressions.includes(NAMES.limit) ? { [NAMES.limit]: CONCURRENCY_LIMIT } : {}),
        ...(expressions.includes(NAMES.fence) ? { [NAMES.fence]: FENCING_TOKEN } : {}),
        ...(expressions.includes(QUEUE_NAMES.head) ? { [QUEUE_NAMES.head]: QUEUE_HEAD } : {}),
        ...(expressions.includes(QUEUE_NAMES.tail) ? { [QUEUE_NAMES.tail]: QUEUE_TAIL } : {}),
        ...(next !== undefined && expressions.includes(QUEUE_NAMES.next) ? { [QUEUE_NAMES.next]: next } : {}),
        ...(expressions.includes(NAMES.collecting) ? { [NAMES.collecting]: COLLECTING } : {}),
        ...(expressions.includes(NAMES.collectGate) ? { [NAMES.collectGate]: COLLECT_GATE } : {}),
        ...(expressions.includes(NAMES.bodies) ? { [NAMES.bodies]: BODIES_RUNNING } : {}),
        ...(expressions.includes(NAMES.bodyLimit) ? { [NAMES.bodyLimit]: BODY_LIMIT } : {}),
        ...(expressions.includes(NAMES.rate) ? { [NAMES.rate]: RATE_INTERVAL } : {}),
      },
      // Every expression that reads the collector's mark compares it with zero.
      ExpressionAttributeValues: expressions.includes(VALUES.zero) ? { [VALUES.zero]: { N: '0' }, ...values } : values,
      ReturnValues: returnValues,
    });
    return out.Attributes ?? {};
  } catch (e) {
    if (errorName(e) === 'ConditionalCheckFailedException') return undefined;
    throw e;
  }
}

/** Errors that may pass: throttling, server errors, time-outs and broken connections. */
function isTransient(e: unknown): boolean {
  const err = e as { name?: string; code?: string; $fault?: string };
  return (
    err.$fault === 'server' ||
    ['ThrottlingException', 'ProvisionedThroughputExceededException', 'RequestLimitExceeded', 'TimeoutError'].includes(err.name ?? '') ||
    ['ECONNRESET', 'ECONNREFUSED', 'ETIMEDOUT', 'EPIPE', 'EAI_AGAIN'].includes(err.code ?? '')
  );
}

/** A holder entry's acquire plus the lock's rate interval (epoch ms): the earliest its permits go back; undefined without a rate. */
function rateHoldEndOf(entry: Record<string, AttributeValue> | undefined, rateSeconds: number | undefined): number | undefined {
  const acquiredAt = entry?.[HOLDER_ACQUIRED_AT]?.S;
  return acquiredAt === undefined || rateSeconds === undefined ? undefined : Date.parse(acquiredAt) + rateSeconds * 1000;
}

function numberOf(value: AttributeValue | undefined): number | undefined {
  return value?.N === undefined ? undefined : Number(value.N);
}

/** The limit an acquire applies (the smaller of its own and the lock's) and the lock's, from the item or the updated attributes. */
function limits(own: number, item: Record<string, AttributeValue> | undefined): { limit: number; lockLimit?: number } {
  const stored = item?.[CONCURRENCY_LIMIT]?.N;
  if (stored === undefined) return { limit: own };
  const lockLimit = Number(stored);
  return { limit: Math.min(own, lockLimit), lockLimit };
}

function notAnExecution(holder: string): void {
  if (isExecutionHolder(holder)) {
    throw new Error(`${holder} is an execution, not a lease: its permit lasts as long as it runs (forceRelease frees it)`);
  }
}

/** A lock name the table can key: 1 to MAX_LOCK_NAME_LENGTH characters, without the ticket key separator. */
function validLockName(lockName: string): void {
  if (typeof lockName !== 'string' || lockName.length === 0 || lockName.length > MAX_LOCK_NAME_LENGTH) {
    throw new Error(`the lock name must be 1 to ${MAX_LOCK_NAME_LENGTH} characters long, got: ${JSON.stringify(String(lockName).slice(0, 40))}`);
  }
  if (lockName.includes(TICKET_KEY_SEPARATOR)) {
    throw new Error(`the lock name must not contain the character U+001F (it keys the queue's ticket items), got: ${JSON.stringify(lockName.slice(0, 40))}`);
  }
}

function positive(name: string, value: number): void {
  if (!(value > 0) || !Number.isFinite(value)) throw new Error(`${name} must be a positive number of seconds, got: ${value}`);
}

/** Wait `ms` (at most about 24.8 days: timers take no more), or less if `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    // A longer delay would make setTimeout fire at once.
    const timer = setTimeout(done, Math.min(ms, 2 ** 31 - 1));
    signal?.addEventListener('abort', done, { once: true });
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
  });
}
