import { Duration } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { IIdempotencyTable } from './idempotency-table';
import { jmesPathError, KeySelection } from './private/idempotency-key';
import { validateFieldPaths } from './private/validation';

/**
 * Which part of an execution's input identifies a repeat.
 *
 * The key is a SHA-256 hash over a canonical JSON text of the selected part, with the keys of every
 * object sorted: the order of keys inside the input never changes the key, while any other
 * difference does (`"1"` and `1` are different keys).
 */
export class IdempotencyKey {
  /**
   * The whole execution input.
   */
  public static wholeInput(): IdempotencyKey {
    return new IdempotencyKey({ kind: 'input' });
  }

  /**
   * The values at these JSONPaths of the input (`$.orderId`, `$.customer['id']`, `$.items[0].sku`).
   * A missing field counts as `null`; when every field is missing or `null` the execution fails with
   * `IdempotencyKeyMissing`.
   *
   * @param paths JSONPaths into the execution input, with `.name`, `['name']` and `[index]` steps
   */
  public static fromFields(...paths: string[]): IdempotencyKey {
    validateFieldPaths('key', paths);
    return new IdempotencyKey({ kind: 'fields', paths });
  }

  /**
   * The result of a JMESPath expression over the input, as in the AWS idempotent-workflow sample
   * (for example `[orderId, customer.id]`). When it gives `null`, or nothing but nulls (`[null, null]`),
   * the execution fails with `IdempotencyKeyMissing`.
   *
   * @param expression a JMESPath expression
   */
  public static fromJmesPath(expression: string): IdempotencyKey {
    const error = expression.trim() === '' ? 'it is empty' : jmesPathError(expression);
    if (error !== undefined) {
      throw new Error(`\`key\` must be a valid JMESPath expression, got: '${expression}' (${error})`);
    }
    return new IdempotencyKey({ kind: 'jmespath', expression });
  }

  private constructor(
    /** @internal */
    public readonly _selection: KeySelection,
  ) {}
}

/**
 * How a workflow recognizes repeated inputs and replays their results.
 */
export interface IdempotencyOptions {
  /**
   * Which part of the input identifies a repeat.
   *
   * @default IdempotencyKey.wholeInput()
   */
  readonly key?: IdempotencyKey;

  /**
   * JSONPaths of fields that a repeat must match (payload validation, as in Powertools for AWS Lambda).
   * A repeat whose key matches but whose validated fields differ fails with
   * `IdempotencyValidationError` instead of returning the stored result.
   *
   * @default - no validation: a matching key is a repeat
   */
  readonly validateFields?: string[];

  /**
   * How long a completed record counts, from its completion. After that, the
   * same input runs the body again. Checked by timestamp in the workflow itself; DynamoDB TTL removes
   * expired records, up to days later. A record IN_PROGRESS never expires while its execution runs.
   * (TTL comes a week after the execution's start plus this, or the workflow's `timeout` and a day if
   * that is longer: give workflows that may run longer than a week a `timeout`.)
   *
   * Whole seconds, at least 1 second.
   *
   * @default Duration.hours(24)
   */
  readonly expiresAfter?: Duration;

  /**
   * The table of records.
   *
   * @default - a new `IdempotencyTable`
   */
  readonly table?: IIdempotencyTable;

  /**
   * How often a duplicate that arrives while the first execution still runs checks whether it has
   * finished. Each check waits a random whole number of seconds between half this interval and all
   * of it (jitter), so duplicates started together do not poll together.
   *
   * Whole seconds, at least 1 second.
   *
   * @default Duration.seconds(10)
   */
  readonly duplicatePollInterval?: Duration;

  /**
   * How long a duplicate waits for the first execution before it fails with
   * `IdempotencyDuplicateTimeout`. Counted in checks: the timeout over three quarters of
   * `duplicatePollInterval` (the average wait), so the actual wait is about this long. Each check
   * spends 23 of the 25,000 history events an execution may have: at most 782 checks fit in an
   * `IdempotentWorkflow`, and 391 in a `ConcurrencyControlledWorkflow`, whose wait for a permit needs
   * the other half of the 18,000 events its waits may spend.
   *
   * @default - one hour, or as long as the checks that fit take, when that is shorter (`duplicatePollInterval` under 7 seconds, or under 13 seconds in a `ConcurrencyControlledWorkflow`)
   */
  readonly duplicateWaitTimeout?: Duration;

  /**
   * Runtime of the function that computes idempotency keys: a Node.js runtime, `nodejs22.x` or newer.
   * Lambda deprecates `nodejs22.x` on 2027-04-30 and blocks creating functions on it from 2027-06-01;
   * choose a newer one then (`new lambda.Runtime('nodejs24.x', lambda.RuntimeFamily.NODEJS)` where
   * aws-cdk-lib lacks `Runtime.NODEJS_24_X`). The function is shared by the idempotent workflows of a
   * stack that choose the same runtime.
   *
   * @default lambda.Runtime.NODEJS_22_X
   */
  readonly keyFunctionRuntime?: lambda.Runtime;
}
