import { Duration, Token } from 'aws-cdk-lib';
import { MAX_CONCURRENCY_LIMIT, MAX_RATE_INTERVAL_SECONDS } from './private/lock-schema';

/**
 * At most `count` acquisitions of a lock in any `interval`: a sliding window, wherever it starts.
 *
 * Each acquisition holds its permit for at least `interval` (the body runs beside a Wait of that
 * length, and every other path that frees the permit waits it out too), and at most `count` permits
 * exist, so `count + 1` acquisitions inside one `interval` would hold `count + 1` permits at once.
 */
export class RateLimit {
  /** At most `count` acquisitions in any second. */
  public static perSecond(count: number): RateLimit {
    return new RateLimit(count, Duration.seconds(1));
  }

  /** At most `count` acquisitions in any minute. */
  public static perMinute(count: number): RateLimit {
    return new RateLimit(count, Duration.minutes(1));
  }

  /**
   * At most `count` acquisitions in any `interval` (a whole number of seconds, at least 1: a Step
   * Functions Wait state waits whole seconds).
   */
  public static of(count: number, interval: Duration): RateLimit {
    return new RateLimit(count, interval);
  }

  /** The most acquisitions in any `interval`. */
  public readonly count: number;

  /** The window. */
  public readonly interval: Duration;

  private constructor(count: number, interval: Duration) {
    if (!Token.isUnresolved(count) && (!Number.isInteger(count) || count < 1 || count > MAX_CONCURRENCY_LIMIT)) {
      throw new Error(
        `\`rateLimit\` count must be an integer from 1 to ${MAX_CONCURRENCY_LIMIT} (each acquisition in the window holds a permit of the lock), got: ${count}`,
      );
    }
    const millis = interval.toMilliseconds();
    if (Token.isUnresolved(millis)) {
      throw new Error('`rateLimit` interval must be known at synth (the Wait states that hold a permit for it are rendered from it), got a token');
    }
    if (millis < 1000 || millis % 1000 !== 0 || millis > MAX_RATE_INTERVAL_SECONDS * 1000) {
      throw new Error(
        `\`rateLimit\` interval must be a whole number of seconds from 1 to ${MAX_RATE_INTERVAL_SECONDS} (one day; Step Functions waits whole seconds), got: ${interval.toHumanString()}`,
      );
    }
    this.count = count;
    this.interval = interval;
  }

  /** The interval in seconds. */
  public get intervalSeconds(): number {
    return this.interval.toSeconds();
  }
}
