import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import { Construct } from 'constructs';

/**
 * A function with a role and a log group of its own, rather than the managed
 * AWSLambdaBasicExecutionRole (cdk-nag AwsSolutions-IAM4): write access to exactly its log group and
 * nothing else. `create` builds the function with the role it is given.
 */
export function functionWithOwnLogs<T extends lambda.Function>(scope: Construct, create: (role: iam.Role) => T): { fn: T; role: iam.Role } {
  const role = new iam.Role(scope, 'Role', { assumedBy: new iam.ServicePrincipal('lambda.amazonaws.com') });
  const fn = create(role);
  const logGroup = new logs.LogGroup(scope, 'LogGroup', {
    logGroupName: `/aws/lambda/${fn.functionName}`,
    retention: logs.RetentionDays.THREE_MONTHS,
  });
  // A policy of its own: in the role's default policy, which the function depends on, it would
  // close a cycle (policy -> log group -> function name -> function -> policy).
  new iam.Policy(scope, 'LogPolicy', {
    roles: [role],
    statements: [new iam.PolicyStatement({ actions: ['logs:CreateLogStream', 'logs:PutLogEvents'], resources: [logGroup.logGroupArn] })],
  });
  return { fn, role };
}
