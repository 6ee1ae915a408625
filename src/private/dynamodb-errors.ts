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
