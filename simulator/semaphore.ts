import type { AttributeValue } from '@aws-sdk/client-dynamodb';
import { itemSizeBytes } from './dynamodb';
import { Execution, Simulator } from './simulator';
import { keyJson } from './transactions';
import {
  BODIES_RUNNING,
  BODY_LIMIT,
  HOLDER_ACQUIRED_AT,
  HOLDER_IN_BODY,
  HOLDER_PERMITS,
  LOCK_KEY,
  PERMITS_IN_USE,
  QUEUE_HEAD,
  TICKET_SERVED_BY,
  TICKET_WAITER,
  isTicketKey,
  ticketKey,
} from '../src/private/lock-schema';
import { STATE } from '../src/private/state-names';

/*
 * Watching a semaphore while it runs in the simulator: the lock items, the invariants over them, and
 * who is inside the protected section. Shared by the tests, the demo and the bench, for our workflow
 * and for the AWS sample's.
 */

/** How a lock item is laid out. */
export interface LockLayout {
  /** Partition key attribute. */
  readonly key: string;
  /** Permit count attribute. */
  readonly count: string;
  /** Whether an attribute is a holder entry. */
  isHolder(name: string, value: AttributeValue): boolean;
  /** How many permits a holder entry holds. @default - one */
  permitsOf?(value: AttributeValue): number;
  /** What is wrong with a lock item's body slots (a second counter), if anything. @default - nothing checked */
  bodySlotViolation?(item: Record<string, AttributeValue>): string | undefined;
  /**
   * For holders kept in items of their own (bench/holder-items-spike.ts): the lock whose permit an item
   * holds, from its key; undefined for any other item. @default - holders are attributes of their lock item
   */
  holderItemOf?(key: string): string | undefined;
  /**
   * For a table with a sort key (bench/transact-queue-spike.ts), whose ticket items share their lock's
   * partition key: whether an item (or its key) is a lock item. @default - every item whose key is not a ticket's
   */
  isLockItem?(item: Record<string, AttributeValue>): boolean;
}

/** Our lock items (src/private/lock-schema.ts). */
export const LOCK_LAYOUT: LockLayout = {
  key: LOCK_KEY,
  count: PERMITS_IN_USE,
  isHolder: (_name, value) => value.M?.[HOLDER_ACQUIRED_AT] !== undefined,
  permitsOf: (value) => Number(value.M?.[HOLDER_PERMITS]?.N ?? 1),
  // Every entry with a body slot counts one in BODIES_RUNNING, which never passes the lock's BODY_LIMIT.
  bodySlotViolation: (item) => {
    const running = Number(item[BODIES_RUNNING]?.N ?? 0);
    const marked = Object.values(item).filter((v) => v.M?.[HOLDER_ACQUIRED_AT] !== undefined && v.M[HOLDER_IN_BODY] !== undefined).length;
    if (running !== marked) return `${running} body slots taken but ${marked} entries hold one`;
    const limit = item[BODY_LIMIT]?.N;
    return limit !== undefined && running > Number(limit) ? `${running} body slots taken, body limit ${limit}` : undefined;
  },
};

/** The AWS sample's lock items: `LockName`, `currentlockcount`, one attribute per execution ARN. */
export const AWS_SAMPLE_LOCK_LAYOUT: LockLayout = {
  key: 'LockName',
  count: 'currentlockcount',
  isHolder: (name) => name.startsWith('arn:aws:states:'),
};

export interface LockState {
  readonly lockName: string;
  readonly permitsInUse: number;
  readonly holders: string[];
}

/** Every lock item of a table (by logical ID prefix), as plain objects. */
export async function lockStates(sim: Simulator, table: string, layout: LockLayout = LOCK_LAYOUT): Promise<LockState[]> {
  return lockStatesIn(await sim.scan(table), layout);
}

/** The lock items among a table's scanned items, as plain objects. */
export function lockStatesIn(items: Array<Record<string, AttributeValue>>, layout: LockLayout = LOCK_LAYOUT): LockState[] {
  const holderOf = (item: Record<string, AttributeValue>) => layout.holderItemOf?.(item[layout.key]?.S ?? '');
  const locks = items.filter((item) => isLockItem(item, layout)).map((item) => lockStateOf(item, layout));
  if (!layout.holderItemOf) return locks;
  return locks.map((lock) => ({
    ...lock,
    holders: [...lock.holders, ...items.filter((item) => holderOf(item) === lock.lockName).map((item) => item[layout.key].S!)],
  }));
}

/**
 * The ticket items still waiting in `lockName`'s queue, first come first, among a table's scanned items:
 * past the lock's head, not served, with a waiter.
 */
export function waitingTickets(items: Array<Record<string, AttributeValue>>, lockName: string): Array<Record<string, AttributeValue>> {
  const head = Number(items.find((i) => i[LOCK_KEY]?.S === lockName)?.[QUEUE_HEAD]?.N ?? '0');
  const prefix = ticketKey(lockName, '');
  return items
    .filter((item) => item[LOCK_KEY]?.S?.startsWith(prefix))
    .map((item) => ({ ticket: Number(item[LOCK_KEY].S!.slice(prefix.length)), item }))
    .filter(({ ticket, item }) => ticket > head && item[TICKET_SERVED_BY] === undefined && item[TICKET_WAITER] !== undefined)
    .sort((x, y) => x.ticket - y.ticket)
    .map(({ item }) => item);
}

/** Whether an item (or its key) is a lock item: the queue's ticket items share the table, and are not; nor are holder items. */
function isLockItem(item: Record<string, AttributeValue>, layout: LockLayout): boolean {
  const key = item[layout.key]?.S ?? '';
  return layout.isLockItem?.(item) ?? (!isTicketKey(key) && layout.holderItemOf?.(key) === undefined);
}

function lockStateOf(item: Record<string, AttributeValue>, layout: LockLayout): LockState {
  return {
    lockName: item[layout.key].S!,
    permitsInUse: Number(item[layout.count]?.N ?? 0),
    holders: Object.keys(item).filter((k) => layout.isHolder(k, item[k])),
  };
}

/** The permits a lock item's holder entries hold: one each, or a weighted entry's `permits`. */
export function heldPermits(item: Record<string, AttributeValue>, lock: LockState, layout: LockLayout = LOCK_LAYOUT): number {
  // (A holder item of its own holds one.)
  return lock.holders.reduce((n, h) => n + (item[h] === undefined ? 1 : (layout.permitsOf?.(item[h]) ?? 1)), 0);
}

/**
 * Samples every lock item while a simulation runs and records each moment an invariant did not hold:
 * permits in use equal to the number of holders, never negative, never above the limit.
 *
 * It reads the lock items by key, not by scanning the table: the table holds a queue's ticket items
 * too, thousands in a burst, and a scan of them all at every sample made the simulator fall behind its
 * clock as the queue grew. It learns the keys from a scan when it starts, and then from every write
 * (LocalDynamoDb.onItemWritten). Each lock item is read whole, so each sample of a lock is consistent.
 * A layout with holder items of their own (bench/holder-items-spike.ts) is scanned: a lock's sample
 * spans its holder items there, which one read must see at one moment, and that layout has no tickets.
 */
export class LockMonitor {
  public readonly violations: string[] = [];
  public samples = 0;
  public maxPermits = 0;
  /** The largest lock item seen, in bytes as DynamoDB counts them (what every write to it is billed for). Ticket and holder items are not lock items. */
  public maxItemBytes = 0;
  /** The permits in use in all the lock items, at the last sample. */
  public permitsInUse = 0;
  private timer?: NodeJS.Timeout;
  private sampling?: Promise<void>;
  /** The keys of the lock items seen (at the first scan, or written since), by their JSON. */
  private readonly keys = new Map<string, Record<string, unknown>>();
  private stopListening?: () => void;

  constructor(
    private readonly sim: Simulator,
    private readonly table: string,
    private readonly limitOf: (lockName: string) => number,
    private readonly layout: LockLayout = LOCK_LAYOUT,
  ) {}

  public start(intervalMs = 20): this {
    const tableName = this.sim.tableName(this.table);
    const read = this.layout.holderItemOf ? () => this.sim.scan(this.table) : this.readLockItems(tableName);
    const tick = async () => {
      const items = await read();
      let permitsInUse = 0;
      for (const lock of lockStatesIn(items, this.layout)) {
        const item = items.find((i) => i[this.layout.key]?.S === lock.lockName)!;
        this.maxItemBytes = Math.max(this.maxItemBytes, itemSizeBytes(item));
        this.samples++;
        permitsInUse += lock.permitsInUse;
        this.maxPermits = Math.max(this.maxPermits, lock.permitsInUse);
        const permits = heldPermits(item, lock, this.layout);
        const held = `${lock.holders.length} holders${permits === lock.holders.length ? '' : ` holding ${permits}`}`;
        if (lock.permitsInUse < permits) {
          this.violations.push(`${lock.lockName}: ${lock.permitsInUse} permits in use but ${held}`);
        } else if (lock.permitsInUse !== permits) {
          this.violations.push(`${lock.lockName}: ${lock.permitsInUse} permits in use for ${held}`);
        }
        const slots = this.layout.bodySlotViolation?.(item);
        if (slots !== undefined) this.violations.push(`${lock.lockName}: ${slots}`);
        if (lock.permitsInUse < 0 || lock.permitsInUse > this.limitOf(lock.lockName)) {
          this.violations.push(`${lock.lockName}: ${lock.permitsInUse} permits in use, limit ${this.limitOf(lock.lockName)}`);
        }
      }
      this.permitsInUse = permitsInUse;
    };
    const loop = () => {
      this.sampling = tick().then(() => {
        if (this.timer !== undefined) this.timer = setTimeout(loop, intervalMs);
      });
    };
    this.timer = setTimeout(loop, 0);
    return this;
  }

  /** Reads the lock items by their keys, which it learns (see above): a ticket item is never read. */
  private readLockItems(tableName: string): () => Promise<Array<Record<string, AttributeValue>>> {
    const learn = (key: Record<string, unknown>) => {
      const name = (key[this.layout.key] as AttributeValue | undefined)?.S;
      // (One JSON for one key, whatever the order of its attributes: BatchGetItem refuses a key twice.)
      if (name !== undefined && isLockItem(key as Record<string, AttributeValue>, this.layout)) this.keys.set(keyJson(key), key);
    };
    // Listening before the scan: no item written in between is missed.
    this.stopListening = this.sim.db.onItemWritten((written, key) => {
      if (written === tableName) learn(key);
    });
    const scanned = this.sim.scan(this.table).then(async (items) => {
      for (const item of items) learn(await this.sim.db.keyOf(tableName, item));
    });
    return async () => {
      await scanned;
      return this.sim.getItems(tableName, [...this.keys.values()]);
    };
  }

  public async stop(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.stopListening?.();
    await this.sampling;
  }
}

/**
 * Counts the executions inside the protected section, from the states they enter: inside from
 * entering one of `enter` until entering one of `leave` or stopping. The most at once are counted at
 * the times the states were entered, not in the order the simulator reads them (which can be seconds
 * of simulated time late, and later for one execution than for another).
 */
export class InsideTracker {
  /** Inside now, as far as the events read so far tell. */
  public inside = 0;
  /** The permits the executions inside hold (by `permitsOf`), now. */
  public permitsInside = 0;
  private readonly insideNow = new Map<string, number>();
  /** Each way in and out: when, and the permits it adds or takes away. */
  private readonly changes: Array<{ at: number; permits: number }> = [];

  constructor(
    sim: Simulator,
    private readonly enter: string[],
    private readonly leave: string[],
    private readonly permitsOf: (e: Execution) => number = () => 1,
  ) {
    sim.onStateEntered((execution, stateName, enteredAt) => {
      if (this.enter.includes(stateName)) this.add(execution, enteredAt);
      else if (this.leave.includes(stateName)) this.remove(execution, enteredAt);
    });
    sim.onExecutionStopped((execution) => this.remove(execution, sim.now()));
  }

  /** The most executions inside at once. */
  public get maxInside(): number {
    return this.most((permits) => Math.sign(permits));
  }

  /** The most permits held by the executions inside at once. */
  public get maxPermitsInside(): number {
    return this.most((permits) => permits);
  }

  private add(e: Execution, at: number): void {
    if (this.insideNow.has(e.arn)) return;
    const permits = this.permitsOf(e);
    this.insideNow.set(e.arn, permits);
    this.inside++;
    this.permitsInside += permits;
    this.changes.push({ at, permits });
  }

  private remove(e: Execution, at: number): void {
    const permits = this.insideNow.get(e.arn);
    if (permits === undefined) return;
    this.insideNow.delete(e.arn);
    this.inside--;
    this.permitsInside -= permits;
    this.changes.push({ at, permits: -permits });
  }

  /** The highest sum of `weight` over the changes in time order (a way out before a way in at the same time). */
  private most(weight: (permits: number) => number): number {
    const sorted = [...this.changes].sort((a, b) => a.at - b.at || a.permits - b.permits);
    let now = 0;
    let most = 0;
    for (const change of sorted) {
      now += weight(change.permits);
      most = Math.max(most, now);
    }
    return most;
  }
}

/** Where our workflow's protected section starts and ends. */
export const BODY_ENTER: string[] = [STATE.runBody];
export const BODY_LEAVE: string[] = [STATE.release, STATE.releaseAfterFailure];
/**
 * Where the body runs when it takes a body slot (a rate's count other than the concurrency limit): the
 * bodies the limit counts, until the slot goes (above the count, with the entry, after the release at the interval).
 */
export const BODY_SLOT_ENTER: string[] = [STATE.runBodyInSlot];
export const BODY_SLOT_LEAVE: string[] = [
  STATE.releaseBodySlot,
  STATE.releaseBodySlotAfterFailure,
  STATE.releaseBodySlotAndEntry,
  STATE.releaseBodySlotAndEntryAfterFailure,
];
/** The states of our workflow that write a permit. */
export const ACQUIRE_STATES: string[] = [STATE.acquire, STATE.poll];
