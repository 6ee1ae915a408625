import { Duration } from 'aws-cdk-lib';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct } from 'constructs';

/**
 * The dead-letter queue our constructs create when given none (id `DeadLetterQueue`): encrypted with
 * SQS-managed keys, TLS enforced, messages kept 14 days (the most SQS allows).
 */
export function defaultDeadLetterQueue(scope: Construct): sqs.Queue {
  return new sqs.Queue(scope, 'DeadLetterQueue', {
    encryption: sqs.QueueEncryption.SQS_MANAGED,
    enforceSSL: true,
    retentionPeriod: Duration.days(14),
  });
}
