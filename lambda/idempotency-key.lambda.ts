import { computeKey, KeyFunctionEvent, KeyFunctionResult } from '../src/private/idempotency-key';

/*
 * The key function of idempotent workflows: the first state of every execution. It hashes the part
 * of the input the workflow's key covers (and the validated fields), and says when a record written
 * now expires. Pure: no AWS calls, no permissions beyond its logs. Step Functions cannot do this
 * itself: JSONPath has no date arithmetic and no JMESPath, and States.Hash takes at most 10,000
 * characters.
 */
export async function handler(event: KeyFunctionEvent): Promise<KeyFunctionResult> {
  return computeKey(event, Date.now());
}
