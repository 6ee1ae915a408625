import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import {
  ACQUIRE_CONDITION,
  ACQUIRE_UPDATE,
  ACQUIRE_WITH_RATE_UPDATE,
  BODY_LIMIT,
  COLLECTING,
  CONCURRENCY_LIMIT,
  FENCING_TOKEN,
  HOLDER_ACQUIRED_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_EXTRA_PERMITS,
  HOLDER_PERMITS,
  HOLDER_REDRIVE_COUNT,
  LOCK_KEY,
  NAMES,
  PERMITS_IN_USE,
  RATE_INTERVAL,
  STATE_MACHINE_KEY_HASH,
  VALUES,
  WEIGHTED_ACQUIRE_CONDITION,
  WEIGHTED_ACQUIRE_UPDATE,
} from './lock-schema';
import { ISemaphoreTable } from '../semaphore-table';

/**
 * The holder id of the running execution (`executionHolderKey`): the MD5 of its state machine's ARN,
 * rebuilt from `$$.StateMachine.Id`'s partition, Region and account and `$$.StateMachine.Name` (so that
 * a version's or an alias's ARN gives the same), `:`, `$$.Execution.Name`. Nine intrinsic functions:
 * Step Functions allows ten in a field.
 */
export function ownHolderKey(): string {
  const field = (i: number) => sfn.JsonPath.arrayGetItem(sfn.JsonPath.stringSplit(sfn.JsonPath.stringAt('$$.StateMachine.Id'), ':'), i);
  const stateMachineArn = sfn.JsonPath.format('arn:{}:states:{}:{}:stateMachine:{}', field(1), field(3), field(4), sfn.JsonPath.stateMachineName);
  return sfn.JsonPath.format('{}:{}', sfn.JsonPath.hash(stateMachineArn, STATE_MACHINE_KEY_HASH), sfn.JsonPath.executionName);
}

/**
 * The holder id (`executionHolderKey`) of the execution whose ARN is at `executionArnPath`, of the state
 * machine whose ARN is at `stateMachineArnPath` (a status-change event's `stateMachineArn`, unqualified):
 * the execution's name is the ARN's eighth `:`-separated field.
 */
export function holderKeyAt(stateMachineArnPath: string, executionArnPath: string): string {
  const name = sfn.JsonPath.arrayGetItem(sfn.JsonPath.stringSplit(sfn.JsonPath.stringAt(executionArnPath), ':'), 7);
  return sfn.JsonPath.format('{}:{}', sfn.JsonPath.hash(sfn.JsonPath.stringAt(stateMachineArnPath), STATE_MACHINE_KEY_HASH), name);
}

/** The execution's current run (`$$.Execution.RedriveCount`), as a DynamoDB number: the stamp of its entries. */
export function currentRun(): tasks.DynamoAttributeValue {
  return tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$$.Execution.RedriveCount')));
}

/** Which lock item a task writes, and on behalf of which holder. */
export interface LockTaskProps {
  readonly table: ISemaphoreTable;
  /** The lock name, literal or JSONPath. */
  readonly lockName: tasks.DynamoAttributeValue;
  /** The holder id, a JSONPath string token (for a workflow, `ownHolderKey()`). */
  readonly holder: string;
}

/** Properties of an acquire task. */
export interface AcquireTaskProps extends LockTaskProps {
  /** The concurrency limit, literal or JSONPath. */
  readonly limit: tasks.DynamoAttributeValue;
  /** How long the holder may keep the permit before the reconciler stops it. @default - no lease */
  readonly leaseSeconds?: number;
  /** Where `{ fencingToken }` goes in the state data. @default - nowhere: the state data passes through */
  readonly permitPath?: string;
  /** The workflow's rate interval, recorded on the lock item for clients. @default - no rate */
  readonly rateIntervalSeconds?: number;
  /** How many permits one acquisition takes, and its gate (the limit minus them). @default - one */
  readonly weight?: PermitWeight;
  /** The workflow's body slots (a concurrency limit below its rate's count), recorded on the lock item for clients. @default - none */
  readonly bodyLimit?: number;
}

/** The weight of a weighted acquisition (`permits`), as the acquire's values. */
export interface PermitWeight {
  /** How many permits (N), literal or from the input. */
  readonly permits: tasks.DynamoAttributeValue;
  /** The concurrency limit minus them (N): the acquire takes them while `permitsInUse <= gate`. */
  readonly gate: tasks.DynamoAttributeValue;
  /** The permits less one (N), which a hand-off of the whole entry gives back. */
  readonly extra: tasks.DynamoAttributeValue;
  /**
   * The gate of a waiter of the queue that holds one permit and collects the rest (N): the limit less
   * the permits less one. It completes once at most that many are in use. @default - gate + 1
   */
  readonly collectGate: tasks.DynamoAttributeValue;
}

/**
 * One conditional UpdateItem that takes a permit: it fails with ConditionalCheckFailed when the lock
 * is full, and with a validation error (`DynamoDB.AmazonDynamoDBException`, see ACQUIRE_CONDITION)
 * when the holder holds one already, which it then claims. Its policy is `dynamodb:UpdateItem` on the
 * table only.
 */
export function acquireTask(scope: Construct, id: string, props: AcquireTaskProps): tasks.DynamoUpdateItem {
  const rate = props.rateIntervalSeconds;
  const weight = props.weight;
  return new tasks.DynamoUpdateItem(scope, id, {
    table: props.table.table,
    key: { [LOCK_KEY]: props.lockName },
    conditionExpression: weight ? WEIGHTED_ACQUIRE_CONDITION : ACQUIRE_CONDITION,
    updateExpression:
      (weight ? WEIGHTED_ACQUIRE_UPDATE : rate === undefined ? ACQUIRE_UPDATE : ACQUIRE_WITH_RATE_UPDATE) +
      (props.bodyLimit === undefined ? '' : `, ${NAMES.bodyLimit} = ${VALUES.bodyLimit}`),
    expressionAttributeNames: {
      [NAMES.permits]: PERMITS_IN_USE,
      [NAMES.holder]: props.holder,
      [NAMES.limit]: CONCURRENCY_LIMIT,
      [NAMES.fence]: FENCING_TOKEN,
      [NAMES.collecting]: COLLECTING,
      ...(rate === undefined ? {} : { [NAMES.rate]: RATE_INTERVAL }),
      ...(props.bodyLimit === undefined ? {} : { [NAMES.bodyLimit]: BODY_LIMIT }),
    },
    expressionAttributeValues: {
      ...(rate === undefined ? {} : { [VALUES.rate]: tasks.DynamoAttributeValue.fromNumber(rate) }),
      ...(props.bodyLimit === undefined ? {} : { [VALUES.bodyLimit]: tasks.DynamoAttributeValue.fromNumber(props.bodyLimit) }),
      ...(weight ? { [VALUES.weight]: weight.permits, [VALUES.gate]: weight.gate } : {}),
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
      [VALUES.limit]: props.limit,
      [VALUES.entry]: tasks.DynamoAttributeValue.fromMap({
        [HOLDER_ACQUIRED_AT]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
        [HOLDER_REDRIVE_COUNT]: currentRun(),
        ...(props.leaseSeconds === undefined ? {} : { [HOLDER_LEASE_SECONDS]: tasks.DynamoAttributeValue.fromNumber(props.leaseSeconds) }),
        ...(weight ? { [HOLDER_PERMITS]: weight.permits, [HOLDER_EXTRA_PERMITS]: weight.extra } : {}),
      }),
    },
    // Without a permit path the write's response carries nothing we need; the state data passes through unchanged.
    ...(props.permitPath
      ? {
        returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
        resultSelector: fencingTokenSelector(),
        resultPath: props.permitPath,
      }
      : { resultPath: sfn.JsonPath.DISCARD }),
  });
}

/** `{ fencingToken }` from the response of a write that returned UPDATED_NEW. */
export function fencingTokenSelector(): Record<string, unknown> {
  return { fencingToken: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt(`$.Attributes.${FENCING_TOKEN}.N`)) };
}
