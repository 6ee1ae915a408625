import { Duration, Token } from 'aws-cdk-lib';
import { parseFieldPath } from './idempotency-key';
import {
  MAX_CONCURRENCY_LIMIT,
  MAX_HOLDER_ENTRY_BYTES,
  MAX_LOCK_NAME_LENGTH,
  MAX_LOCK_STRIPES,
  lockStripeName,
  MAX_PERMITS,
  MAX_PERMITS_REASON,
  TICKET_KEY_SEPARATOR,
} from './lock-schema';

export { MAX_LOCK_STRIPES };

/*
 * Synth-time checks of user input. Each message names the prop, shows the value and says what is
 * allowed; values that are tokens (JSONPath or deploy-time) are not checked.
 */

export function validateLockName(lockName: string): void {
  if (Token.isUnresolved(lockName)) {
    return;
  }
  if (lockName.length === 0 || lockName.length > MAX_LOCK_NAME_LENGTH) {
    throw new Error(
      `\`lockName\` must be 1 to ${MAX_LOCK_NAME_LENGTH} characters long, got: '${abbreviate(lockName)}' (${lockName.length} characters)`,
    );
  }
  // The state machines build ticket keys with States.Format, whose string literals reserve { and }.
  if (/[{}]/.test(lockName)) {
    throw new Error(`\`lockName\` must not contain '{' or '}' (the state machines use it in an intrinsic function), got: '${abbreviate(lockName)}'`);
  }
  if (lockName.includes(TICKET_KEY_SEPARATOR)) {
    throw new Error(
      `\`lockName\` must not contain the character U+001F (the unit separator, which keys the queue's ticket items), got: ${JSON.stringify(abbreviate(lockName))}`,
    );
  }
}

export function validateConcurrencyLimit(limit: number): void {
  if (Token.isUnresolved(limit)) {
    return;
  }
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_CONCURRENCY_LIMIT) {
    throw new Error(
      `\`concurrencyLimit\` must be an integer from 1 to ${MAX_CONCURRENCY_LIMIT} (the lock item keeps one entry per holder, ` +
        `at most ${MAX_HOLDER_ENTRY_BYTES} bytes each, inside DynamoDB's 400 KB per item), got: ${limit}`,
    );
  }
}

/** What `lockStripes` may not be combined with yet, and why: the prop it names, and whether it is set. */
export interface LockStripesConflicts {
  readonly permits: boolean;
  readonly rateLimit: boolean;
  readonly permitPath: boolean;
}

/** The first prop set in `conflicts` that a split lock does not serve yet, and why; undefined if none is. */
export function lockStripesConflict(conflicts: LockStripesConflicts): readonly [prop: string, reason: string] | undefined {
  const found = ([
    ['permits', conflicts.permits, 'a weighted acquisition would need several permits of one stripe'],
    ['rateLimit', conflicts.rateLimit, 'a rate is counted per lock'],
    ['permitPath', conflicts.permitPath, 'each stripe draws fencing tokens of its own, which do not order the holders of different stripes'],
  ] as const).find(([, set]) => set);
  return found && [found[0], found[2]];
}

/** A stripe count a split lock may have (`lockStripes`): an integer from 1 to MAX_LOCK_STRIPES, known at synth. */
export function isLockStripeCount(stripes: number): boolean {
  return !Token.isUnresolved(stripes) && Number.isInteger(stripes) && stripes >= 1 && stripes <= MAX_LOCK_STRIPES;
}

/**
 * `lockStripes`: an integer from 1 to MAX_LOCK_STRIPES; above 1, a `concurrencyLimit` known at synth
 * that it divides, each stripe's share within MAX_CONCURRENCY_LIMIT, a literal lock name short enough
 * for the suffix, and none of the props split locks do not serve yet. Returns each stripe's limit.
 */
export function validateLockStripes(
  stripes: number,
  limit: number | undefined,
  lockName: string,
  conflicts: LockStripesConflicts,
): number | undefined {
  if (!isLockStripeCount(stripes)) {
    throw new Error(
      `\`lockStripes\` must be an integer from 1 to ${MAX_LOCK_STRIPES} (the cleanup reads each stripe for a stopped execution's permit), got: ${stripes}`,
    );
  }
  if (stripes === 1) return limit;
  const conflicting = lockStripesConflict(conflicts);
  if (conflicting) {
    throw new Error(`\`lockStripes\` (${stripes}) cannot be combined with \`${conflicting[0]}\` yet: ${conflicting[1]}. Set one of them`);
  }
  if (limit === undefined || Token.isUnresolved(limit)) {
    throw new Error(
      `\`concurrencyLimit\` must be a number known at synth beside \`lockStripes\` (${stripes}), got: ${limit === undefined ? 'none' : 'a token'}: ` +
        'each stripe is a lock of concurrencyLimit / lockStripes permits, fixed in the definition',
    );
  }
  if (!Number.isInteger(limit) || limit < 1) {
    throw new Error(`\`concurrencyLimit\` must be a positive integer, got: ${limit}`);
  }
  if (limit % stripes !== 0) {
    const lower = limit - (limit % stripes);
    throw new Error(
      `\`concurrencyLimit\` (${limit}) must be a multiple of \`lockStripes\` (${stripes}): each stripe is a lock of concurrencyLimit / lockStripes permits` +
        (lower > 0 ? `; for example ${lower} or ${lower + stripes}` : `; for example ${stripes}`),
    );
  }
  const share = limit / stripes;
  if (share > MAX_CONCURRENCY_LIMIT) {
    throw new Error(
      `\`concurrencyLimit\` / \`lockStripes\` must be at most ${MAX_CONCURRENCY_LIMIT} (each stripe's holders share its lock item), got: ${limit} / ${stripes} = ${share}`,
    );
  }
  if (!Token.isUnresolved(lockName)) {
    const longest = lockStripeName(lockName, stripes - 1);
    if (longest.length > MAX_LOCK_NAME_LENGTH) {
      throw new Error(
        `\`lockName\` must be at most ${MAX_LOCK_NAME_LENGTH - 1 - String(stripes - 1).length} characters beside \`lockStripes\` (${stripes}), ` +
          `so that its stripes' names ('${abbreviate(lockName)}#0' to '#${stripes - 1}') fit in ${MAX_LOCK_NAME_LENGTH}, got ${lockName.length} characters`,
      );
    }
  }
  return share;
}

/** A lock limit from which writes of the whole lock item, three (polling) or five (the queue) per execution through a full lock, meet one partition's write capacity. */
export const HIGH_QUEUE_LIMIT = 100;

/** The holders of a stripe the high-limit warning suggests: at most this many (README, "A limit in the hundreds: split the lock"). */
const SUGGESTED_STRIPE_SHARE = 50;

/**
 * How an execution passes through a full lock, in writes of the lock item, per wait strategy; and the words
 * for it. Every execution of a full lock waits, so it pays its way in as well as its permit's passage:
 * counting only the passage (three writes for the queue, two for polling, until 2026-12-02) gave a bound
 * the measured locks reached 60% of; counting both, the queue's bound is what they reached (README, "The
 * ceiling of a high limit").
 */
const PASSAGE = {
  // The refused acquire and the ticket; then the releaser's refused give-back, its claim of the ticket, the hand-off.
  queue: {
    writes: 5,
    strategy: 'with the queue',
    how: 'every execution that waits writes all of it five times (its refused acquire and its ticket, then the refused give-back, the claim and the hand-off that pass it a permit)',
  },
  // The refused acquire, the poll that finds the permit and the release; each refused poll writes the item once more.
  polling: {
    writes: 3,
    strategy: 'with polling',
    how: 'every execution that waits writes all of it at least three times (its refused acquire, the poll that finds a permit, its release; each refused poll once more)',
  },
};

/**
 * A full lock of `entries` holders passes on at most about `perSecond` permits a second: each execution
 * through it writes the lock item `writes` times, billed by its size, about 0.1 KB plus 0.11 KB per holder
 * (a hand-off's entry for a UUID execution name, whatever the state machine's name; 83 bytes on the bench's
 * shorter names, up to MAX_HOLDER_ENTRY_BYTES at most), against one partition's 1,000 write units a
 * second (README, "The ceiling of a high limit": measured on the bench's names, the queue reached 98 to 103%
 * of it from 50 to 200 holders and 95% at a rate of 100 a second, 36% at 500 where thousands arrived at once;
 * polling, whose refused polls it leaves out, 67 to 109%: for polling it is a figure, not a bound).
 */
function passesPerSecond(entries: number, writes: number): { itemKb: number; perSecond: number } {
  const itemKb = 0.1 + 0.11 * entries;
  return { itemKb, perSecond: 1000 / (writes * Math.ceil(itemKb)) };
}

/**
 * The stripe count the high-limit warning suggests for `limit`: the smallest that divides it into locks of
 * at most SUGGESTED_STRIPE_SHARE, or undefined if none up to MAX_LOCK_STRIPES does (a prime limit).
 */
function suggestedLockStripes(limit: number): number | undefined {
  for (let k = Math.max(2, Math.ceil(limit / SUGGESTED_STRIPE_SHARE)); k <= MAX_LOCK_STRIPES; k++) {
    if (limit % k === 0) return k;
  }
  return undefined;
}

/**
 * Why a fixed `concurrencyLimit` of HIGH_QUEUE_LIMIT or more (a stripe's, where the lock is split into
 * `stripes`) may wait for DynamoDB rather than for permits, with the figures (passesPerSecond) for the
 * queue or, with `polling`, for polling. `splitBlockedBy` names the prop that keeps the lock from being
 * split (`lockStripes` does not combine with it yet), if any: otherwise the message suggests a stripe
 * count for the whole limit (suggestedLockStripes) and what it gives. Undefined below that limit, or for a token.
 */
export function highLimitWarning(limit: number, stripes: number = 1, splitBlockedBy?: string, polling: boolean = false): string | undefined {
  if (Token.isUnresolved(limit) || limit < HIGH_QUEUE_LIMIT) return undefined;
  const passage = polling ? PASSAGE.polling : PASSAGE.queue;
  const { itemKb, perSecond } = passesPerSecond(limit, passage.writes);
  const shortest = limit / perSecond;
  const instead = polling ? 'spread the arrivals' : 'use WaitStrategy.POLLING (README, "The ceiling of a high limit")';
  let split: string;
  if (splitBlockedBy !== undefined) {
    split = `${instead}: splitting the lock (\`lockStripes\`) does not combine with \`${splitBlockedBy}\` yet`;
  } else {
    const total = limit * stripes;
    const k = Math.ceil(total / SUGGESTED_STRIPE_SHARE);
    const suggested = suggestedLockStripes(total);
    let example: string;
    if (k > MAX_LOCK_STRIPES) {
      example = `at most \`lockStripes: ${MAX_LOCK_STRIPES}\`, ${MAX_LOCK_STRIPES} locks of ${Math.ceil(total / MAX_LOCK_STRIPES)} or more: beyond that, lock names of their own for groups of callers`;
    } else if (suggested === undefined) {
      example = `\`lockStripes\` must divide the limit, and none up to ${MAX_LOCK_STRIPES} splits ${total} into locks of ${SUGGESTED_STRIPE_SHARE} or fewer: ` +
        `for example \`concurrencyLimit: ${total - (total % k) + k}, lockStripes: ${k}\``;
    } else {
      const share = total / suggested;
      const shareShortest = (share / passesPerSecond(share, passage.writes).perSecond).toFixed(1);
      example = `for example \`lockStripes: ${suggested}\`, ${suggested} locks of ${share}, which by the same measure keep up with bodies of about ${shareShortest} s and longer`;
    }
    split = `split the lock into several with smaller limits (${example}; README, "A limit in the hundreds: split the lock"), or ${instead}`;
  }
  return (
    `concurrencyLimit ${limit}${stripes > 1 ? ' per stripe' : ''} ${passage.strategy}: the lock item is about ${Math.round(itemKb)} KB with ${limit} holders, ` +
    `and ${passage.how}. One item's partition takes 1,000 write units a second, so a full lock passes on at most about ${perSecond.toFixed(1)} permits a second: ` +
    `bodies shorter than about ${Math.ceil(shortest)} s will wait for DynamoDB rather than for permits. For shorter bodies, ${split}`
  );
}

/**
 * The high-limit warning for a rate (`rateLimit`): its permits turn over at most `count` times an
 * interval, so the lock must pass on count / intervalSeconds permits a second, against passesPerSecond
 * (the queue's, or with `polling` polling's) of an item that holds an entry per permit and, with a
 * `concurrencyLimit` above the count, one per body slot (`bodyLimit`) too. Warns only where the rate asks
 * for more than the item can pass on (a rate of 200 a minute needs 3.3 a second: no warning). Undefined for tokens.
 */
export function highRateWarning(count: number, intervalSeconds: number, bodyLimit: number | undefined, polling: boolean = false): string | undefined {
  if ([count, intervalSeconds, bodyLimit ?? 0].some((value) => Token.isUnresolved(value))) return undefined;
  const passage = polling ? PASSAGE.polling : PASSAGE.queue;
  const entries = count + (bodyLimit !== undefined && bodyLimit > count ? bodyLimit : 0);
  const { itemKb, perSecond } = passesPerSecond(entries, passage.writes);
  const asked = count / intervalSeconds;
  if (asked <= perSecond) return undefined;
  const slots = entries > count ? ` and ${bodyLimit} body slots` : '';
  return (
    `rateLimit of ${count} per ${intervalSeconds} s ${passage.strategy}: the lock item is about ${Math.round(itemKb)} KB with ` +
    `${count} permits${slots}, and ${passage.how}. One item's partition takes 1,000 write units a second, so a saturated rate passes on at most about ` +
    `${perSecond.toFixed(1)} permits a second, below the ${asked.toFixed(1)} a second it allows: executions will wait for DynamoDB rather than for the rate. ` +
    'A split lock (`lockStripes`) does not serve rates yet: give each group of callers a lock name of its own with a share of the rate' +
    (entries > count ? `, or a \`concurrencyLimit\` of ${count} or less (body slots above the count are entries of the same item)` : '') +
    ' (README, "The ceiling of a high limit")'
  );
}

/**
 * `permits` (the weight of one acquisition): an integer from 1 to MAX_PERMITS, and at most the
 * concurrency limit when both are known (a weight above the limit could never be granted).
 */
export function validatePermits(permits: number, limit: number): void {
  if (Token.isUnresolved(permits)) {
    return;
  }
  if (!Number.isInteger(permits) || permits < 1 || permits > MAX_PERMITS) {
    throw new Error(`\`permits\` must be an integer from 1 to ${MAX_PERMITS} (${MAX_PERMITS_REASON}), got: ${permits}`);
  }
  if (!Token.isUnresolved(limit) && permits > limit) {
    throw new Error(`\`permits\` (${permits}) must be at most \`concurrencyLimit\` (${limit}): an acquisition of more permits than the lock has would wait forever`);
  }
}

/** A duration of whole seconds, at least `minSeconds`; returns the seconds, or undefined for a token. */
export function validateWholeSeconds(prop: string, duration: Duration, minSeconds: number): number | undefined {
  const millis = duration.toMilliseconds();
  if (Token.isUnresolved(millis)) {
    return undefined;
  }
  if (millis < minSeconds * 1000 || millis % 1000 !== 0) {
    throw new Error(
      `\`${prop}\` must be a whole number of seconds, at least ${minSeconds} second${minSeconds === 1 ? '' : 's'}, got: ${duration.toHumanString()}`,
    );
  }
  return millis / 1000;
}

/** As validateWholeSeconds, and refused when a token: for a duration that a state or a setting is rendered from at synth. */
export function knownWholeSeconds(prop: string, duration: Duration, minSeconds: number): number {
  const seconds = validateWholeSeconds(prop, duration, minSeconds);
  if (seconds === undefined) throw new Error(`\`${prop}\` must be known at synth, got a token`);
  return seconds;
}

export function validateFieldPaths(prop: string, paths: string[]): void {
  if (paths.length === 0) {
    throw new Error(`\`${prop}\` must list at least one JSONPath, got an empty list`);
  }
  for (const path of paths) {
    if (Token.isUnresolved(path)) {
      throw new Error(`\`${prop}\` must be literal JSONPaths, got a token: ${path}`);
    }
    if (parseFieldPath(path) === undefined) {
      throw new Error(
        `\`${prop}\` must be JSONPaths into the execution input made of \`.name\`, \`['name']\` and \`[index]\` steps after \`$\` (for example \`$.order.id\`), got: '${path}'`,
      );
    }
  }
}

function abbreviate(s: string): string {
  return s.length > 40 ? `${s.slice(0, 37)}...` : s;
}

/** A JSONPath of a field in the state data (`$.permit`), for a result to be put there. */
export function validatePermitPath(prop: string, path: string): void {
  if (Token.isUnresolved(path) || !/^\$(\.[A-Za-z_][A-Za-z0-9_]*)+$/.test(path)) {
    throw new Error(`\`${prop}\` must be a JSONPath of a field made of \`.name\` steps after \`$\` (for example \`$.permit\`), got: '${path}'`);
  }
}

/** A whole number of seconds in words, every unit that is not zero: `4 days 3 hours 50 minutes`. */
export function humanSeconds(seconds: number): string {
  const units: Array<[string, number]> = [['day', 86400], ['hour', 3600], ['minute', 60], ['second', 1]];
  const parts: string[] = [];
  let rest = Math.round(seconds);
  for (const [name, size] of units) {
    const n = Math.floor(rest / size);
    rest -= n * size;
    if (n > 0) parts.push(`${n} ${name}${n === 1 ? '' : 's'}`);
  }
  return parts.length > 0 ? parts.join(' ') : '0 seconds';
}
