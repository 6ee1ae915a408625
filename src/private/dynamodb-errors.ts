import { Duration } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';

/*
 * Error names as the optimized DynamoDB integration (`arn:aws:states:::dynamodb:*`) raises them:
 * `DynamoDB.<Java SDK exception>`. The AWS SDK integrations spell the prefix `DynamoDb.`; a Retry or
 * Catch with the wrong prefix never matches, so every name we match on is defined here, once.
 */

/** The condition of a conditional write did not hold: the lock is full, or the holder is (not) there. */
export const CONDITIONAL_CHECK_FAILED = 'DynamoDB.ConditionalCheckFailedException';

/**
 * Throttling: DynamoDB rejected the request without applying it, so any call may simply be retried.
 */
export const THROTTLING_ERRORS = [
  'DynamoDB.ProvisionedThroughputExceededException',
  'DynamoDB.RequestLimitExceededException',
  'DynamoDB.ThrottlingException',
];

/**
 * Server errors: the write may or may not have been applied. Every write is retried: a release or a
 * cleanup is idempotent, and an acquire whose first attempt landed fails its retry on the execution's
 * own entry with VALIDATION_ERROR (see ACQUIRE_CONDITION), after which the execution claims it.
 */
export const SERVER_ERRORS = ['DynamoDB.InternalServerErrorException'];

/**
 * A request DynamoDB rejects as invalid (the optimized integration names every ValidationException
 * after the SDK's base class). The acquire raises it on purpose when the holder holds a permit already.
 */
export const VALIDATION_ERROR = 'DynamoDB.AmazonDynamoDBException';

/** Retries of a call that meets a transient error, after its first attempt (transientRetry). */
export const TRANSIENT_RETRIES = 40;

/**
 * Retries of a transient error: 40, with full jitter, exponential up to a cap of 8 s, so about 2.5
 * minutes in all on average (5 at most). A hot lock item's partition (1,000 write units a second, each
 * write billed by the whole item) can stay over its rate for a minute when thousands of executions
 * arrive at once: there a throttled acquire is waiting, not failing, and a throttled release must land
 * rather than leave its permit to the cleanup. (With 10 retries, of 2,000 executions at limit 500 the
 * queue failed 812 by throttling and polling 819: README, "The ceiling of a high limit".) At a 5% throttling
 * rate 11 attempts in a row were already improbable (5e-15). A throttled request consumes no capacity;
 * every retry is a billed transition and 3 history events, so this is only reached on errors.
 *
 * Longer pauses were measured and not taken (2026-12-01, `npm run bench -- --without-sample --only
 * high-limit,ceiling-100,ceiling-200`): they save retries where nothing copes anyway and cost throughput
 * where the lock does. Pauses up to 30 s (15 retries), and for the writes that take a place (the first
 * acquire, a poll, a ticket) up to 60 s, halved the queue's cost at limit 500 ($2.20 to $0.99 per 1,000
 * executions, 145,011 throttled calls to 53,782) and doubled its acquisitions a second once full (1.5 to
 * 3.5); but at limits 100 and 200 the queue passed 13.1 and 7.1 a second instead of 20.9 and 12.0, and
 * polling 20.4 and 9.8 instead of 29.6 and 20.4 (30 s alone, for every call: the queue 12.5 and 7.8), and
 * at limit 500 one polling execution failed by throttling. Callers asleep for tens of seconds leave the
 * partition idle once it has room.
 */
export function transientRetry(errors: string[]): sfn.RetryProps {
  return {
    errors,
    interval: Duration.seconds(1),
    backoffRate: 2,
    maxDelay: Duration.seconds(8),
    jitterStrategy: sfn.JitterType.FULL,
    maxAttempts: TRANSIENT_RETRIES,
  };
}
