import { computeKey, KeyFunctionEvent, KeyFunctionResult } from '../src/private/idempotency-key';

/*
 * The key function of idempotent workflows: the first state of every execution. It hashes the part
 * of the input the workflow's key covers (and the validated fields), and gives the times its record
 * needs: the cut-off before which completed records no longer count, and the TTLs. Pure: no AWS calls, no permissions beyond its logs. Step Functions cannot do this
 * itself: JSONPath has no date arithmetic and no JMESPath, and States.Hash takes at most 10,000
 * characters.
 */
export async function handler(event: KeyFunctionEvent): Promise<KeyFunctionResult> {
  return computeKey(event, Date.now());
}
