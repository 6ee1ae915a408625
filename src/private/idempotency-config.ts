import { ArnFormat, Duration, Names, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';
import { functionWithOwnLogs } from './function-logs';
import { IdempotencyKeyFunction } from './idempotency-key-function';
import { IdempotencyStates } from './idempotency-states';
import { validateFieldPaths, validateWholeSeconds } from './validation';
import { IdempotencyKey, IdempotencyOptions } from '../idempotency-options';
import { IdempotencyTable, IIdempotencyTable } from '../idempotency-table';

/** What a workflow with idempotency needs: its states, table and key function. */
export interface RenderedIdempotency {
  readonly states: IdempotencyStates;
  readonly table: IIdempotencyTable;
  readonly keyFunction: lambda.IFunction;
}

/**
 * Check the options and create the idempotency states (and, if needed, the table) of a workflow whose
 * state machine will be called `stateMachineName`. Shared by `IdempotentWorkflow` and
 * `ConcurrencyControlledWorkflow`.
 */
export function renderIdempotency(scope: Construct, options: IdempotencyOptions, stateMachineName: string): RenderedIdempotency {
  const expiresAfterSeconds = validateWholeSeconds('expiresAfter', options.expiresAfter ?? Duration.hours(24), 1) ?? 24 * 3600;
  const pollSeconds = validateWholeSeconds('duplicatePollInterval', options.duplicatePollInterval ?? Duration.seconds(10), 1) ?? 10;
  if (options.validateFields !== undefined) {
    validateFieldPaths('validateFields', options.validateFields);
  }
  const table = options.table ?? new IdempotencyTable(scope, 'IdempotencyTable');
  const keyFunction = sharedKeyFunction(scope);
  const stack = Stack.of(scope);
  const states = new IdempotencyStates(scope, {
    table,
    keyFunction,
    prefix: Names.uniqueResourceName(scope, { maxLength: 128, separator: '-' }),
    key: (options.key ?? IdempotencyKey.wholeInput())._selection,
    validate: options.validateFields === undefined ? undefined : { kind: 'fields', paths: options.validateFields },
    expiresAfterSeconds,
    pollSeconds,
    executionArnPattern: stack.formatArn({
      service: 'states',
      resource: 'execution',
      resourceName: `${stateMachineName}:*`,
      arnFormat: ArnFormat.COLON_RESOURCE_NAME,
    }),
  });
  return { states, table, keyFunction };
}

/**
 * A physical name for a state machine, derived from the construct path: the idempotency states
 * describe executions of their own state machine, and a generated name would make the role's policy
 * depend on the state machine, which depends on the policy.
 */
export function defaultStateMachineName(scope: Construct): string {
  return Names.uniqueResourceName(scope, { maxLength: 80, separator: '-' });
}

/** The key function of the stack: pure, so one serves every idempotent workflow in it. */
function sharedKeyFunction(scope: Construct): lambda.IFunction {
  const stack = Stack.of(scope);
  const id = 'CdkSfnSemaphoreIdempotencyKey';
  const existing = stack.node.tryFindChild(id) as Construct | undefined;
  if (existing) {
    return existing.node.findChild('Function') as lambda.IFunction;
  }
  const holder = new Construct(stack, id);
  return functionWithOwnLogs(holder, (role) =>
    new IdempotencyKeyFunction(holder, 'Function', {
      role,
      timeout: Duration.seconds(10),
      memorySize: 256,
      description: 'Computes idempotency keys of execution inputs (cdk-sfn-semaphore)',
    }),
  ).fn;
}
