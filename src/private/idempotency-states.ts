import { Duration } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { CONDITIONAL_CHECK_FAILED, SERVER_ERRORS, THROTTLING_ERRORS, transientRetry } from './dynamodb-errors';
import { KeyFunctionEvent, KeySelection } from './idempotency-key';
import {
  CLAIM_CONDITION,
  CLAIM_UPDATE,
  COMPLETE_CONDITION,
  FAIL_UPDATE,
  RECORD_EXPIRES_AT,
  RECORD_COMPLETED_AT,
  RECORD_KEY,
  RECORD_NAMES,
  RECORD_OWNER,
  RECORD_RESULT,
  RECORD_STATUS,
  RECORD_VALIDATION,
  RECORD_VALUES,
  STATUS,
  SUCCEED_UPDATE,
  TAKE_OVER_CONDITION,
} from './idempotency-schema';
import { SFN_THROTTLED_ERRORS } from './queue-states';
import { STATE } from './state-names';
import { IIdempotencyTable } from '../idempotency-table';

/** Error of a repeat whose validated fields differ from those of the execution that wrote the record. */
export const VALIDATION_ERROR = 'IdempotencyValidationError';

/** Error of a duplicate that waited `duplicateWaitTimeout` for the first execution to finish. */
export const DUPLICATE_TIMEOUT_ERROR = 'IdempotencyDuplicateTimeout';

/** Error of an execution whose output is too large to be stored in its record. */
export const RESULT_TOO_LARGE_ERROR = 'IdempotencyResultTooLarge';

/**
 * Step Functions' own error when a state's input after Parameters exceeds the payload quota (256 KiB).
 * A terminal error that States.ALL does not catch, so it is named explicitly.
 * https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
 */
const DATA_LIMIT_EXCEEDED = 'States.DataLimitExceeded';

/**
 * AWS SDK integration error of DescribeExecution for an execution that does not exist. SDK integrations
 * name errors `ServiceName.ErrorName`, both PascalCase, always with the `Exception` suffix (`sfn` gives
 * `Sfn`, as `acmpca` gives `AcmPca`).
 * https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html
 */
const EXECUTION_DOES_NOT_EXIST = 'Sfn.ExecutionDoesNotExistException';

/** Everything the idempotency states need to know, checked and resolved by the construct. */
export interface IdempotencyConfig {
  readonly table: IIdempotencyTable;
  readonly keyFunction: lambda.IFunction;
  /** Prefix of this workflow's keys. */
  readonly prefix: string;
  readonly key: KeySelection;
  readonly validate?: KeySelection;
  readonly expiresAfterSeconds: number;
  /** TTL margin of completed records past the execution's start. @default - a week (the key function's default) */
  readonly ttlMarginSeconds?: number;
  /** A waiting duplicate checks again after a random whole number of seconds in [ceil(poll/2), poll]. */
  readonly pollSeconds: number;
  /** How many times a duplicate waits before it gives up with `IdempotencyDuplicateTimeout`. */
  readonly maxWaits: number;
  /** The ARN pattern of this workflow's executions (the record owners the states describe). */
  readonly executionArnPattern: string;
}

/*
 * The state data, from the first state on, is what the key function returns:
 *
 *   { payload, key, validation, notBeforeIso, expiresAt, inProgressExpiresAt, waits: { count }, missingOwner }
 *
 * The protected part reads the execution input at `$.payload` and puts the body's output (a
 * Parallel's, so an array of one) in its place, so that input and output never have to fit in the
 * 256 KiB of state data together; an error goes to `$.error`.
 */

/** Where the protected part finds the execution input. */
export const INPUT_PATH = '$.payload';
/** Where the protected part puts the body Parallel's result (replacing the input). */
export const OUTPUT_PATH = '$.payload';
/** Where the protected part puts a caught error (`{Error, Cause}`). */
export const ERROR_PATH = '$.error';

/**
 * The states of an idempotent workflow around its protected part (the body, or acquire → body →
 * release):
 *
 *   Compute Idempotency Key → Claim Idempotency Record ──claimed──▶ protected part ──▶ Save Idempotent Result
 *                                │ taken                                 │ error
 *                                ▼                                       ▼
 *                         Read Idempotency Record → Check ─┬─ SUCCEEDED → Return Stored Result (reads the result)
 *                                                          ├─ other fields → Idempotency Validation Failed
 *                                                          └─ IN_PROGRESS → Check Record Owner ─┬─ running → Count → Wait For Duplicate → Claim
 *                                                                                               ├─ running too long → Duplicate Wait Timed Out
 *                                                                                               ├─ ended → Take Over → protected part
 *                                                                                               └─ does not exist → (the second time) Take Over;
 *                                                                                                  (the first) Note Missing Owner → Wait For Missing Owner → Claim
 *
 * The uncontended path costs two states (key, claim) and, after the body, one (save). The record's
 * stored result is read only by the state that returns it, which replaces the state data: a repeat
 * never holds its input and the stored result at once, so that it fits Step Functions' 256 KiB.
 */
export class IdempotencyStates {
  /** Success tail: stores the result; the execution's output is the body's. */
  public readonly saveResult: sfn.IChainable;
  /** Failure tail: marks the record FAILED (so that a retry runs again) and fails with `$.error`. */
  public readonly markFailed: sfn.IChainable;

  private readonly recordKey: { [key: string]: tasks.DynamoAttributeValue };

  constructor(private readonly scope: Construct, private readonly config: IdempotencyConfig) {
    this.recordKey = { [RECORD_KEY]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$.key')) };
    const writeRetry = transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]);

    const failWithError = new sfn.Fail(scope, STATE.failWithError, { errorPath: `${ERROR_PATH}.Error`, causePath: `${ERROR_PATH}.Cause` });
    this.markFailed = this.completeTask(STATE.markFailed, FAIL_UPDATE)
      .addRetry(writeRetry)
      // Not ours any more (taken over by a duplicate while this execution was stopped, then redriven).
      .addCatch(failWithError, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .next(failWithError);

    const output = `${OUTPUT_PATH}[0]`;
    const resultTooLarge = new sfn.Fail(scope, STATE.resultTooLarge, {
      error: RESULT_TOO_LARGE_ERROR,
      cause:
        'The body succeeded, but its output is too large to store in the idempotency record: the write would exceed Step Functions\' 256 KiB payload quota. The record is marked FAILED, so a retry runs the body again.',
    });
    const markResultTooLarge = this.completeTask(STATE.markResultTooLarge, FAIL_UPDATE)
      .addRetry(writeRetry)
      .addCatch(resultTooLarge, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .next(resultTooLarge);
    this.saveResult = this.completeTask(STATE.saveResult, SUCCEED_UPDATE, output)
      // A retry after a write that landed fails its condition: the output is still the body's.
      .addRetry(writeRetry)
      .addCatch(new sfn.Succeed(scope, STATE.resultNotSaved, { outputPath: output }), {
        errors: [CONDITIONAL_CHECK_FAILED],
        resultPath: sfn.JsonPath.DISCARD,
      })
      .addCatch(markResultTooLarge, { errors: [DATA_LIMIT_EXCEEDED], resultPath: sfn.JsonPath.DISCARD });
  }

  /** The states from the start of the execution up to `protectedStart`, which runs once the key is claimed. */
  public start(protectedStart: sfn.IChainable): sfn.IChainable {
    const { scope, config } = this;
    const event: Omit<KeyFunctionEvent, 'input'> = {
      prefix: config.prefix,
      key: config.key,
      ...(config.validate ? { validate: config.validate } : {}),
      expiresAfterSeconds: config.expiresAfterSeconds,
      ...(config.ttlMarginSeconds !== undefined ? { ttlMarginSeconds: config.ttlMarginSeconds } : {}),
    };
    const computeKey = new tasks.LambdaInvoke(scope, STATE.computeKey, {
      lambdaFunction: config.keyFunction,
      payload: sfn.TaskInput.fromObject({ input: sfn.JsonPath.entirePayload, ...event }),
      payloadResponseOnly: true,
      resultPath: '$',
    })
      // Bursts of executions are what this library is for; CDK's default retry leaves throttling out.
      .addRetry(transientRetry(['Lambda.TooManyRequestsException']));

    const claimValues = {
      [RECORD_VALUES.inProgress]: tasks.DynamoAttributeValue.fromString(STATUS.inProgress),
      [RECORD_VALUES.me]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.Execution.Id')),
      [RECORD_VALUES.inProgressExpiresAt]: tasks.DynamoAttributeValue.numberFromString(
        sfn.JsonPath.format('{}', sfn.JsonPath.stringAt('$.inProgressExpiresAt')),
      ),
      [RECORD_VALUES.validation]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$.validation')),
    };
    const claim = new tasks.DynamoUpdateItem(scope, STATE.claimRecord, {
      table: config.table.table,
      key: this.recordKey,
      conditionExpression: CLAIM_CONDITION,
      updateExpression: CLAIM_UPDATE,
      expressionAttributeNames: this.names(RECORD_STATUS, RECORD_OWNER, RECORD_EXPIRES_AT, RECORD_COMPLETED_AT, RECORD_VALIDATION, RECORD_RESULT),
      expressionAttributeValues: {
        ...claimValues,
        [RECORD_VALUES.failed]: tasks.DynamoAttributeValue.fromString(STATUS.failed),
        [RECORD_VALUES.succeeded]: tasks.DynamoAttributeValue.fromString(STATUS.succeeded),
        [RECORD_VALUES.notBefore]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$.notBeforeIso')),
      },
      resultPath: sfn.JsonPath.DISCARD,
    })
      // The claim succeeds again for its own owner, so a retry after a write that landed is safe.
      .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]));

    const read = new tasks.DynamoGetItem(scope, STATE.readRecord, {
      table: config.table.table,
      key: this.recordKey,
      consistentRead: true,
      // Not the result: beside the input it could pass the 256 KiB of state data (Return Stored Result reads it).
      projectionExpression: [RECORD_NAMES.status, RECORD_NAMES.owner, RECORD_NAMES.validation].map((n) =>
        new tasks.DynamoProjectionExpression().withAttribute(n),
      ),
      expressionAttributeNames: this.names(RECORD_STATUS, RECORD_OWNER, RECORD_VALIDATION),
      resultPath: '$.record',
    }).addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]));
    claim.addCatch(read, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    claim.next(protectedStart);

    // A duplicate whose first execution still runs waits; one whose first execution is gone takes over.
    const half = Math.ceil(config.pollSeconds / 2);
    const waitForDuplicate = new sfn.Wait(scope, STATE.waitForDuplicate, { time: sfn.WaitTime.secondsPath('$.ownerState.delaySeconds') }).next(claim);
    const countWait = new sfn.Pass(scope, STATE.countWait, {
      parameters: { count: sfn.JsonPath.mathAdd(sfn.JsonPath.numberAt('$.waits.count'), 1) },
      resultPath: '$.waits',
    }).next(waitForDuplicate);
    const takeOver = new tasks.DynamoUpdateItem(scope, STATE.takeOverRecord, {
      table: config.table.table,
      key: this.recordKey,
      conditionExpression: TAKE_OVER_CONDITION,
      updateExpression: CLAIM_UPDATE,
      expressionAttributeNames: this.names(RECORD_STATUS, RECORD_OWNER, RECORD_EXPIRES_AT, RECORD_COMPLETED_AT, RECORD_VALIDATION, RECORD_RESULT),
      expressionAttributeValues: {
        ...claimValues,
        [RECORD_VALUES.deadOwner]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$.record.Item.owner.S')),
      },
      resultPath: sfn.JsonPath.DISCARD,
    })
      .addRetry(transientRetry(THROTTLING_ERRORS))
      // Someone else took it first, or a server error left it open whether we did: claim (or see) again.
      .addCatch(claim, { errors: [CONDITIONAL_CHECK_FAILED, ...SERVER_ERRORS], resultPath: sfn.JsonPath.DISCARD });
    takeOver.next(protectedStart);

    // Validation compares with records that count: a SUCCEEDED one, or the IN_PROGRESS one of an
    // execution that still runs (a dead one's record is taken over, whatever it validated).
    const validationDiffers = sfn.Condition.not(sfn.Condition.stringEqualsJsonPath('$.record.Item.validation.S', '$.validation'));
    const validationFailed = new sfn.Fail(scope, STATE.validationFailed, {
      error: VALIDATION_ERROR,
      cause: 'An execution with the same idempotency key but different validated fields ran before; this input is not a repeat of it',
    });
    const ownerRunning = sfn.Condition.stringEquals('$.ownerState.status', 'RUNNING');
    const isOwnerRunning = new sfn.Choice(scope, STATE.isOwnerRunning);
    if (config.validate) {
      isOwnerRunning.when(sfn.Condition.and(ownerRunning, validationDiffers), validationFailed);
    }
    isOwnerRunning
      .when(
        sfn.Condition.and(ownerRunning, sfn.Condition.numberGreaterThanEquals('$.waits.count', config.maxWaits)),
        new sfn.Fail(scope, STATE.duplicateTimedOut, {
          error: DUPLICATE_TIMEOUT_ERROR,
          cause: `The execution with the same idempotency key was still running after ${config.maxWaits} checks`,
        }),
      )
      .when(ownerRunning, countWait)
      .otherwise(takeOver);
    const checkOwner = new tasks.CallAwsService(scope, STATE.checkOwner, {
      service: 'sfn',
      action: 'describeExecution',
      iamAction: 'states:DescribeExecution',
      iamResources: [config.executionArnPattern],
      parameters: { ExecutionArn: sfn.JsonPath.stringAt('$.record.Item.owner.S') },
      resultSelector: {
        status: sfn.JsonPath.stringAt('$.Status'),
        delaySeconds: sfn.JsonPath.mathRandom(half, config.pollSeconds + 1),
      },
      resultPath: '$.ownerState',
    })
      // DescribeExecution only reads: a throttled call is retried.
      .addRetry({ errors: SFN_THROTTLED_ERRORS, interval: Duration.seconds(1), backoffRate: 2, maxAttempts: 6, jitterStrategy: sfn.JitterType.FULL });
    checkOwner.next(isOwnerRunning);

    // An owner that does not exist: its history was deleted (90 days after it ended), or the record is
    // older than its state machine. DescribeExecution is eventually consistent, though, and may not
    // know an execution that has just started: take over only when the same owner is missing again
    // one poll later.
    const noteMissingOwner = new sfn.Pass(scope, STATE.noteMissingOwner, { inputPath: '$.record.Item.owner.S', resultPath: '$.missingOwner' })
      .next(new sfn.Wait(scope, STATE.waitForMissingOwner, { time: sfn.WaitTime.duration(Duration.seconds(config.pollSeconds)) }))
      .next(claim);
    const missingBefore = new sfn.Choice(scope, STATE.ownerMissingBefore)
      .when(sfn.Condition.stringEqualsJsonPath('$.missingOwner', '$.record.Item.owner.S'), takeOver)
      .otherwise(noteMissingOwner);
    checkOwner.addCatch(missingBefore, { errors: [EXECUTION_DOES_NOT_EXIST], resultPath: sfn.JsonPath.DISCARD });

    // The stored result replaces the state data (input included): a result that was stored fits alone.
    const returnStored = new tasks.DynamoGetItem(scope, STATE.returnStoredResult, {
      table: config.table.table,
      key: this.recordKey,
      consistentRead: true,
      projectionExpression: [new tasks.DynamoProjectionExpression().withAttribute(RECORD_NAMES.result)],
      expressionAttributeNames: this.names(RECORD_RESULT),
      resultSelector: { output: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt('$.Item.result.S')) },
      resultPath: '$',
      outputPath: '$.output',
    }).addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]));
    const succeeded = sfn.Condition.stringEquals('$.record.Item.status.S', STATUS.succeeded);
    const check = new sfn.Choice(scope, STATE.checkRecord)
      // Gone since the claim failed (expired and deleted): claim again.
      .when(sfn.Condition.isNotPresent('$.record.Item'), claim);
    if (config.validate) {
      check.when(sfn.Condition.and(succeeded, validationDiffers), validationFailed);
    }
    check
      .when(succeeded, returnStored)
      .when(sfn.Condition.stringEquals('$.record.Item.status.S', STATUS.inProgress), checkOwner)
      // FAILED since the claim failed: claim again.
      .otherwise(claim);
    read.next(check);

    return sfn.Chain.start(computeKey).next(claim);
  }

  /** An UpdateItem of our own IN_PROGRESS record, to SUCCEEDED (with the result at `outputPath`) or FAILED. */
  private completeTask(id: string, update: typeof SUCCEED_UPDATE | typeof FAIL_UPDATE, outputPath?: string): tasks.DynamoUpdateItem {
    const succeed = update === SUCCEED_UPDATE;
    return new tasks.DynamoUpdateItem(this.scope, id, {
      table: this.config.table.table,
      key: this.recordKey,
      conditionExpression: COMPLETE_CONDITION,
      updateExpression: update,
      expressionAttributeNames: this.names(RECORD_STATUS, RECORD_OWNER, RECORD_EXPIRES_AT, RECORD_COMPLETED_AT, ...(succeed ? [RECORD_RESULT] : [])),
      expressionAttributeValues: {
        [RECORD_VALUES.me]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.Execution.Id')),
        [RECORD_VALUES.inProgress]: tasks.DynamoAttributeValue.fromString(STATUS.inProgress),
        [RECORD_VALUES.expiresAt]: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.format('{}', sfn.JsonPath.stringAt('$.expiresAt'))),
        [RECORD_VALUES.completedAt]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
        ...(succeed
          ? {
            [RECORD_VALUES.succeeded]: tasks.DynamoAttributeValue.fromString(STATUS.succeeded),
            [RECORD_VALUES.result]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt(outputPath!))),
          }
          : { [RECORD_VALUES.failed]: tasks.DynamoAttributeValue.fromString(STATUS.failed) }),
      },
      resultPath: sfn.JsonPath.DISCARD,
      outputPath,
    });
  }

  private names(...attributes: string[]): { [key: string]: string } {
    const byAttribute: Record<string, string> = {
      [RECORD_STATUS]: RECORD_NAMES.status,
      [RECORD_OWNER]: RECORD_NAMES.owner,
      [RECORD_EXPIRES_AT]: RECORD_NAMES.expiresAt,
      [RECORD_COMPLETED_AT]: RECORD_NAMES.completedAt,
      [RECORD_VALIDATION]: RECORD_NAMES.validation,
      [RECORD_RESULT]: RECORD_NAMES.result,
    };
    return Object.fromEntries(attributes.map((a) => [byAttribute[a], a]));
  }
}
