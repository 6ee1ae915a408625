import { Duration, RemovalPolicy } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';
import { IdempotencyOptions } from './idempotency-options';
import { IIdempotencyTable } from './idempotency-table';
import { defaultStateMachineName, renderIdempotency } from './private/idempotency-config';
import { KEY_MISSING_ERROR } from './private/idempotency-key';
import { DUPLICATE_TIMEOUT_ERROR, ERROR_PATH, INPUT_PATH, OUTPUT_PATH, RESULT_TOO_LARGE_ERROR, VALIDATION_ERROR } from './private/idempotency-states';
import { stateMachineLogs } from './private/state-machine-defaults';
import { STATE } from './private/state-names';

/**
 * Properties of an `IdempotentWorkflow`.
 */
export interface IdempotentWorkflowProps extends IdempotencyOptions {
  /**
   * The states to run once per distinct input.
   *
   * They receive the execution input unchanged, and their output becomes the execution's output (and
   * the stored result). If they fail, the record is marked FAILED, so that a retry runs them again,
   * and the execution fails with their own error and cause.
   */
  readonly body: sfn.IChainable;

  /**
   * Name of the state machine.
   *
   * @default - a name derived from the construct path (idempotent workflows describe their own
   * executions, so the name must be known before the state machine exists)
   */
  readonly stateMachineName?: string;

  /**
   * Maximum run time of an execution. The TTL of a completed record allows for it (its execution's
   * start plus `expiresAfter` plus the longer of a week and this timeout and a day), so that DynamoDB
   * never deletes a record before it expires.
   *
   * @default - no timeout
   */
  readonly timeout?: Duration;

  /**
   * Logging of the state machine.
   *
   * @default - a new log group, level ALL, without execution data
   */
  readonly logs?: sfn.LogOptions;

  /**
   * Whether the state machine sends traces to X-Ray.
   *
   * @default true
   */
  readonly tracingEnabled?: boolean;

  /**
   * The IAM role the state machine runs with.
   *
   * @default - a new role with exactly the permissions the definition needs
   */
  readonly role?: iam.IRole;

  /**
   * What happens to the state machine when it leaves the stack.
   *
   * @default RemovalPolicy.DESTROY
   */
  readonly removalPolicy?: RemovalPolicy;

  /**
   * A comment on the state machine definition.
   *
   * @default - a comment that says what the workflow does
   */
  readonly comment?: string;
}

/**
 * A Standard state machine that runs `body` once per distinct input and returns the stored result
 * for a repeat, like the AWS idempotent-workflow sample and Powertools for AWS Lambda's idempotency.
 *
 * - The first execution of a key writes an IN_PROGRESS record (one conditional write), runs the body,
 *   and stores its output (SUCCEEDED) or marks the record FAILED.
 * - A repeat after success returns the stored output without running the body.
 * - A duplicate that arrives while the first execution runs waits, with jittered polling, and then
 *   returns its result. If the first execution is no longer running (stopped, timed out, failed outside
 *   the body), the duplicate takes the record over and runs the body itself.
 * - After FAILED, or once the record has expired (`expiresAfter`), the next execution runs again.
 *
 * For a body that must also not run too often at once, use `ConcurrencyControlledWorkflow` with its
 * `idempotency` option: the same states around a semaphore.
 *
 * @example
 * import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
 * import { IdempotencyKey, IdempotentWorkflow } from 'cdk-sfn-semaphore';
 *
 * declare const chargeCard: sfn.IChainable;
 * new IdempotentWorkflow(this, 'Payments', {
 *   body: chargeCard,
 *   key: IdempotencyKey.fromFields('$.paymentId'),
 *   validateFields: ['$.amount', '$.currency'],
 * });
 */
export class IdempotentWorkflow extends Construct {
  /**
   * Error of a repeat whose key matches an earlier execution's but whose validated fields differ.
   */
  public static readonly VALIDATION_ERROR = VALIDATION_ERROR;

  /**
   * Error of an execution whose output is too large to store in its record. The body did run; the
   * record is marked FAILED.
   */
  public static readonly RESULT_TOO_LARGE_ERROR = RESULT_TOO_LARGE_ERROR;

  /**
   * Error of an execution whose key selects nothing from its input.
   */
  public static readonly KEY_MISSING_ERROR = KEY_MISSING_ERROR;

  /**
   * Error of a duplicate that waited `duplicateWaitTimeout` for the execution with the same key to
   * finish.
   */
  public static readonly DUPLICATE_TIMEOUT_ERROR = DUPLICATE_TIMEOUT_ERROR;

  /**
   * The state machine.
   */
  public readonly stateMachine: sfn.StateMachine;

  /**
   * The table of records.
   */
  public readonly table: IIdempotencyTable;

  /**
   * The function that computes keys (one per stack, shared by its idempotent workflows).
   */
  public readonly keyFunction: lambda.IFunction;

  constructor(scope: Construct, id: string, props: IdempotentWorkflowProps) {
    super(scope, id);
    const stateMachineName = props.stateMachineName ?? defaultStateMachineName(this);
    const idempotency = renderIdempotency(this, props, stateMachineName, props.timeout);
    this.table = idempotency.table;
    this.keyFunction = idempotency.keyFunction;

    const runBody = new sfn.Parallel(this, STATE.runBody, { inputPath: INPUT_PATH, resultPath: OUTPUT_PATH })
      .branch(props.body)
      .addCatch(idempotency.states.markFailed, { errors: [sfn.Errors.ALL], resultPath: ERROR_PATH });
    runBody.next(idempotency.states.saveResult);

    const logOptions = stateMachineLogs(this, props.logs);
    this.stateMachine = new sfn.StateMachine(this, 'StateMachine', {
      definitionBody: sfn.DefinitionBody.fromChainable(idempotency.states.start(runBody)),
      stateMachineName,
      stateMachineType: sfn.StateMachineType.STANDARD,
      timeout: props.timeout,
      logs: logOptions,
      tracingEnabled: props.tracingEnabled ?? true,
      role: props.role,
      removalPolicy: props.removalPolicy,
      comment: props.comment ?? 'Runs its body once per distinct input and replays the stored result for a repeat (cdk-sfn-semaphore)',
    });
    this.table.table.encryptionKey?.grantEncryptDecrypt(this.stateMachine);
  }

  /**
   * Grant the principal permission to start executions.
   */
  public grantStartExecution(grantee: iam.IGrantable): iam.Grant {
    return this.stateMachine.grantStartExecution(grantee);
  }

  /**
   * Grant the principal permission to read the state machine and its executions.
   */
  public grantRead(grantee: iam.IGrantable): iam.Grant {
    return this.stateMachine.grantRead(grantee);
  }
}
