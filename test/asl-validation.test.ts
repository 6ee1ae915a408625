import { App, Duration, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { CfnTemplate, physicalResources, resolve } from '../simulator/cfn';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps, IdempotencyKey, IdempotentWorkflow, RateLimit, WaitStrategy } from '../src';

// asl-validator has no type declarations.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const aslValidator = require('asl-validator') as (definition: unknown, options?: unknown) => { isValid: boolean; errorsText: (sep?: string) => string };

/** Every state machine definition of a stack, with the template's references resolved. */
function definitions(stack: Stack): Record<string, unknown> {
  const template = Template.fromStack(stack).toJSON() as CfnTemplate;
  const resources = physicalResources(template, stack.stackName);
  return Object.fromEntries(
    Object.entries(template.Resources)
      .filter(([, r]) => r.Type === 'AWS::StepFunctions::StateMachine')
      .map(([id, r]) => [id, JSON.parse(resolve(r.Properties!.DefinitionString, resources, stack.stackName))]),
  );
}

/**
 * Step Functions' rule that asl-validator does not check: `States.ALL` stands alone in its `ErrorEquals`,
 * in the last retrier or catcher (CreateStateMachine refuses anything else). Where it is broken.
 * https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
 */
function misplacedStatesAll(definition: any): string[] {
  const found: string[] = [];
  const visit = (machine: any) => {
    for (const [name, state] of Object.entries<any>(machine.States ?? {})) {
      for (const field of ['Retry', 'Catch']) {
        const list: any[] = state[field] ?? [];
        list.forEach((entry, i) => {
          const errors: string[] = entry.ErrorEquals ?? [];
          if (errors.includes('States.ALL') && (errors.length > 1 || i !== list.length - 1)) found.push(`${name}: ${field}[${i}]`);
        });
      }
      for (const branch of state.Branches ?? []) visit(branch);
      if (state.ItemProcessor ?? state.Iterator) visit(state.ItemProcessor ?? state.Iterator);
    }
  };
  visit(definition);
  return found;
}

/**
 * Step Functions' other rule that asl-validator does not check: "You can nest up to 10 intrinsic functions
 * within a field" (https://docs.aws.amazon.com/step-functions/latest/dg/intrinsic-functions.html; its
 * example of nine counts every call in the field). Fields with more, and how many.
 */
function overNestedIntrinsics(definition: unknown): string[] {
  const found: string[] = [];
  const visit = (value: unknown, where: string) => {
    if (Array.isArray(value)) {value.forEach((v, i) => visit(v, `${where}[${i}]`));} else if (typeof value === 'object' && value !== null) {
      for (const [key, v] of Object.entries(value)) {
        const calls = key.endsWith('.$') && typeof v === 'string' ? (v.match(/\bStates\.[A-Za-z]+\(/g) ?? []).length : 0;
        if (calls > 10) found.push(`${where}.${key}: ${calls}`);
        visit(v, `${where}.${key}`);
      }
    }
  };
  visit(definition, '');
  return found;
}

function validate(definition: unknown) {
  // The validator annotates the definition it reads; give it a copy.
  return aslValidator(JSON.parse(JSON.stringify(definition)), { checkPaths: true, checkArn: true });
}

const configurations: Array<[string, Partial<ConcurrencyControlledWorkflowProps>]> = [
  ['defaults', {}],
  ['fixed lock, limit and poll interval', { lockName: 'reports', concurrencyLimit: 4, pollInterval: Duration.seconds(10) }],
  ['lock name and limit from the input', { lockName: sfn.JsonPath.stringAt('$.lock'), concurrencyLimit: sfn.JsonPath.numberAt('$.limit') }],
  ['acquire timeout and execution timeout', { acquireTimeout: Duration.minutes(5), timeout: Duration.hours(1) }],
  [
    'idempotent, with validation and a limit from the input',
    { concurrencyLimit: sfn.JsonPath.numberAt('$.limit'), acquireTimeout: Duration.minutes(5), idempotency: { key: IdempotencyKey.fromJmesPath('[a, b]'), validateFields: ['$.c'] } },
  ],
  ['a rate limit beside the same concurrency limit', { rateLimit: RateLimit.perSecond(4), concurrencyLimit: 4 }],
  ['a rate limit beside a higher concurrency limit (the permit back at the interval, the slot kept)', { rateLimit: RateLimit.perSecond(2), concurrencyLimit: 8 }],
  [
    'a rate limit beside a higher concurrency limit, polling, idempotent',
    { rateLimit: RateLimit.perSecond(2), concurrencyLimit: 8, waitStrategy: WaitStrategy.POLLING, idempotency: { key: IdempotencyKey.fromFields('$.id') } },
  ],
  ['a rate limit alone, the queue (the release beside the body)', { rateLimit: RateLimit.perSecond(10) }],
  ['a rate limit beside a lower concurrency limit (body slots)', { rateLimit: RateLimit.perSecond(10), concurrencyLimit: 2 }],
  [
    'a rate limit, polling, idempotent, a lock name from the input',
    { rateLimit: RateLimit.perMinute(30), waitStrategy: WaitStrategy.POLLING, lockName: sfn.JsonPath.stringAt('$.lock'), idempotency: { key: IdempotencyKey.fromFields('$.id') } },
  ],
  ['a fixed weight, the queue (collecting the permits one by one)', { permits: 3, concurrencyLimit: 5 }],
  ['a weight from the input, polling, with a lease', { permits: sfn.JsonPath.numberAt('$.weight'), concurrencyLimit: 10, waitStrategy: WaitStrategy.POLLING, leaseDuration: Duration.minutes(5) }],
  ['a lock split into stripes, the queue, acquire timeout', { concurrencyLimit: 500, lockStripes: 10, acquireTimeout: Duration.minutes(5) }],
  ['a lock split into stripes, idempotent', { concurrencyLimit: 20, lockStripes: 4, idempotency: { key: IdempotencyKey.fromFields('$.id') } }],
  ['a lock from the input split into stripes, polling', { lockName: sfn.JsonPath.stringAt('$.lock'), concurrencyLimit: 12, lockStripes: 4, waitStrategy: WaitStrategy.POLLING }],
  ['a weight from the input, idempotent, acquire timeout', { permits: sfn.JsonPath.numberAt('$.weight'), concurrencyLimit: 8, acquireTimeout: Duration.minutes(5), idempotency: { key: IdempotencyKey.fromFields('$.id') } }],
];

describe('every synthesized definition passes asl-validator', () => {
  test.each(configurations)('%s', (_name, props) => {
    const stack = new Stack(new App(), 'Stack');
    new ConcurrencyControlledWorkflow(stack, 'Workflow', {
      body: new sfn.Pass(stack, 'Work').next(new sfn.Wait(stack, 'Think', { time: sfn.WaitTime.duration(Duration.seconds(1)) })),
      ...props,
    });

    const defs = definitions(stack);

    expect(Object.keys(defs)).toHaveLength(2); // the workflow and its cleanup
    for (const [id, definition] of Object.entries(defs)) {
      const result = validate(definition);
      expect({ id, errors: result.errorsText('\n') }).toEqual({ id, errors: '' });
      expect(result.isValid).toBe(true);
      expect({ id, misplaced: misplacedStatesAll(definition) }).toEqual({ id, misplaced: [] });
      expect({ id, overNested: overNestedIntrinsics(definition) }).toEqual({ id, overNested: [] });
      // The holder id takes nine (its state machine's ARN rebuilt from the context object, hashed).
      expect(JSON.stringify(definition)).toMatch(id.includes('Cleanup') ? /States\.Hash\(\$\.(detail\.)?stateMachineArn/ : /States\.Hash\(States\.Format\('arn:/);
    }
  });

  test('a field of more than 10 intrinsic functions is found', () => {
    // n calls: a Format of n - 1 UUIDs.
    const calls = (n: number) => `States.Format('${'{}'.repeat(n - 1)}', ${Array.from({ length: n - 1 }, () => 'States.UUID()').join(', ')})`;
    const definition = { States: { A: { Type: 'Pass', Parameters: { 'ten.$': calls(10), 'deeper': { 'eleven.$': calls(11) } } } } };
    expect(overNestedIntrinsics(definition)).toEqual(['.States.A.Parameters.deeper.eleven.$: 11']);
  });

  test('a States.ALL that is not alone, or not last, is found', () => {
    const definition = {
      States: {
        A: { Type: 'Task', Catch: [{ ErrorEquals: ['States.ALL'], Next: 'B' }, { ErrorEquals: ['X'], Next: 'B' }] },
        P: { Type: 'Parallel', Branches: [{ States: { C: { Type: 'Task', Retry: [{ ErrorEquals: ['X', 'States.ALL'] }] } } }] },
      },
    };
    expect(misplacedStatesAll(definition)).toEqual(['A: Catch[0]', 'C: Retry[0]']);
  });

  test('IdempotentWorkflow', () => {
    const stack = new Stack(new App(), 'Stack');
    new IdempotentWorkflow(stack, 'Workflow', { body: new sfn.Pass(stack, 'Work'), validateFields: ['$.amount'] });
    const [definition] = Object.values(definitions(stack));
    const result = validate(definition);
    expect(result.errorsText('\n')).toBe('');
    expect(result.isValid).toBe(true);
  });

  test('the validator does reject a broken definition', () => {
    const stack = new Stack(new App(), 'Stack');
    new ConcurrencyControlledWorkflow(stack, 'Workflow', { body: new sfn.Pass(stack, 'Work') });
    const [definition] = Object.values(definitions(stack)) as any[];

    definition.States['Acquire Permit'].Next = 'No Such State';

    expect(validate(definition).isValid).toBe(false);
  });
});
