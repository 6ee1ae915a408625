import { App, Aspects, Stack } from 'aws-cdk-lib';
import { Annotations, Match } from 'aws-cdk-lib/assertions';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { AwsSolutionsChecks, NagSuppressions } from 'cdk-nag';
import { ConcurrencyControlledWorkflow, IdempotencyKey, IdempotentWorkflow } from '../src';

/** Every AwsSolutions finding (errors and warnings), as "construct path: rule[finding]". */
function findings(stack: Stack): string[] {
  const annotations = Annotations.fromStack(stack);
  return [
    ...annotations.findError('*', Match.stringLikeRegexp('AwsSolutions-.*')),
    ...annotations.findWarning('*', Match.stringLikeRegexp('AwsSolutions-.*')),
  ]
    .map((m) => `${m.id}: ${String(m.entry.data).split(': ')[0]}`)
    .sort();
}

function stackWithWorkflow(lockName?: string, lockStripes?: number) {
  const stack = new Stack(new App(), 'Stack');
  Aspects.of(stack).add(new AwsSolutionsChecks({ verbose: true }));
  const split = lockStripes === undefined ? {} : { lockStripes, concurrencyLimit: 10 * lockStripes };
  const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body: new sfn.Pass(stack, 'Work'), lockName, ...split });
  return { stack, workflow };
}

/*
 * SF1 (log ALL events), SF2 (X-Ray tracing), DDB3 (point-in-time recovery), SQS4 (TLS only) and every
 * other rule are met by the defaults. What is left cannot be fixed, and is suppressed here, each
 * with its reason and scoped to the exact finding.
 */
function suppressJustifiedFindings(workflow: ConcurrencyControlledWorkflow): void {
  for (const role of [workflow.stateMachine.role, workflow.cleanupStateMachine.role]) {
    NagSuppressions.addResourceSuppressions(
      role,
      [{ id: 'AwsSolutions-IAM5', reason: 'X-Ray and CloudWatch Logs delivery actions support no resource-level permissions', appliesTo: ['Resource::*'] }],
      true,
    );
  }
  NagSuppressions.addResourceSuppressions(
    [workflow.cleanupStateMachine.role, workflow.reconciler.reconcilerFunction.role!],
    [
      {
        id: 'AwsSolutions-IAM5',
        reason: 'Describe (and stop) executions of the protected state machine, whose names are known at run time only',
        appliesTo: [{ regex: '/^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:.*:\\*$/' }],
      },
    ],
    true,
  );
  NagSuppressions.addResourceSuppressions(workflow.cleanup.deadLetterQueue, [
    { id: 'AwsSolutions-SQS3', reason: 'This queue is itself the dead-letter queue of the cleanup rule target' },
  ]);
  NagSuppressions.addResourceSuppressions(workflow.reconciler.deadLetterQueue, [
    { id: 'AwsSolutions-SQS3', reason: "This queue is itself the dead-letter queue of the reconciler's redrive rule and failed invocations" },
  ]);
}

test('the defaults leave only findings that cannot be fixed', () => {
  const { stack } = stackWithWorkflow(sfn.JsonPath.stringAt('$.tenant'));

  expect(findings(stack)).toEqual([
    '/Stack/Workflow/Cleanup/DeadLetterQueue/Resource: AwsSolutions-SQS3',
    '/Stack/Workflow/Cleanup/StateMachine/Role/DefaultPolicy/Resource: AwsSolutions-IAM5[Resource::*]',
    expect.stringMatching(/^\/Stack\/Workflow\/Cleanup\/StateMachine\/Role\/DefaultPolicy\/Resource: AwsSolutions-IAM5\[Resource::arn:.*:execution:.*:\*\]$/),
    '/Stack/Workflow/Reconciler/DeadLetterQueue/Resource: AwsSolutions-SQS3',
    expect.stringMatching(/^\/Stack\/Workflow\/Reconciler\/Role\/DefaultPolicy\/Resource: AwsSolutions-IAM5\[Resource::arn:.*:execution:.*:\*\]$/),
    '/Stack/Workflow/StateMachine/Role/DefaultPolicy/Resource: AwsSolutions-IAM5[Resource::*]',
  ]);
});

test.each<[string, string | undefined, number | undefined]>([
  ['a fixed lock name', undefined, undefined],
  ['a lock name from the input', sfn.JsonPath.stringAt('$.tenant'), undefined],
  ['a lock split into stripes (the cleanup reads each)', undefined, 4],
])('with %s, AwsSolutions passes once the justified findings are suppressed', (_name, lockName, lockStripes) => {
  const { stack, workflow } = stackWithWorkflow(lockName, lockStripes);

  suppressJustifiedFindings(workflow);

  expect(findings(stack)).toEqual([]);
});

describe('idempotency', () => {
  function idempotentStack(withSemaphore: boolean, suppress: boolean): Stack {
    const stack = new Stack(new App(), 'Stack');
    Aspects.of(stack).add(new AwsSolutionsChecks({ verbose: true }));
    const body = new sfn.Pass(stack, 'Work');
    const workflow = withSemaphore
      ? new ConcurrencyControlledWorkflow(stack, 'Workflow', { body, idempotency: { key: IdempotencyKey.fromFields('$.id') } })
      : new IdempotentWorkflow(stack, 'Workflow', { body });
    if (!suppress) return stack;
    if (workflow instanceof ConcurrencyControlledWorkflow) {
      suppressJustifiedFindings(workflow);
    }
    NagSuppressions.addResourceSuppressions(
      workflow.stateMachine.role,
      [
        { id: 'AwsSolutions-IAM5', reason: 'X-Ray and CloudWatch Logs delivery actions support no resource-level permissions', appliesTo: ['Resource::*'] },
        {
          id: 'AwsSolutions-IAM5',
          reason: 'Describe the owners of idempotency records: executions of this state machine, named at run time',
          appliesTo: [{ regex: '/^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:.*:\\*$/' }],
        },
        {
          id: 'AwsSolutions-IAM5',
          reason: 'LambdaInvoke grants the key function and its versions (`:*`)',
          appliesTo: [{ regex: '/^Resource::<CdkSfnSemaphoreIdempotencyKeyFunction.*\\.Arn>:\\*$/' }],
        },
      ],
      true,
    );
    return stack;
  }

  test.each([
    ['IdempotentWorkflow', false],
    ['ConcurrencyControlledWorkflow with idempotency', true],
  ])('%s: only the findings that cannot be fixed, and none once they are suppressed', (_name, withSemaphore) => {
    const policy = '/Stack/Workflow/StateMachine/Role/DefaultPolicy/Resource: AwsSolutions-IAM5';
    const expected = [
      `${policy}[Resource::*]`,
      expect.stringMatching(/^\/Stack\/Workflow\/StateMachine\/Role\/DefaultPolicy\/Resource: AwsSolutions-IAM5\[Resource::<CdkSfnSemaphoreIdempotencyKeyFunction.*\.Arn>:\*\]$/),
      expect.stringMatching(/^\/Stack\/Workflow\/StateMachine\/Role\/DefaultPolicy\/Resource: AwsSolutions-IAM5\[Resource::arn:.*:execution:Stack-Workflow-[0-9A-F]+:\*\]$/),
    ];
    // The key function's own role and log group raise nothing; the semaphore's findings are tested above.
    const actual = findings(idempotentStack(withSemaphore, false)).filter((f) => f.startsWith('/Stack/Workflow/StateMachine/') || f.startsWith('/Stack/CdkSfn'));
    expect(actual).toEqual(expect.arrayContaining(expected));
    expect(actual).toHaveLength(expected.length);

    expect(findings(idempotentStack(withSemaphore, true))).toEqual([]);
  });
});
