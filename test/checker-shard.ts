import { CONFIGS } from '../checker/configs';
import { checkConfig, report } from '../checker/run';

/**
 * Search every configuration of one shard (checker/configs.ts): each must hold every invariant, with
 * its whole bounded state space searched.
 */
export function describeCheckerShard(shard: 1 | 2): void {
  describe(`every bounded configuration of shard ${shard} holds every invariant`, () => {
    test.each(CONFIGS.filter((c) => c.shard === shard).map((c) => [c.name, c] as const))('%s', (_name, config) => {
      const result = checkConfig(config);
      // The figures, for the record: the states searched and the time.
      console.log(report(config, result));
      expect(result.counterexample?.violation).toBeUndefined();
      expect(result.incomplete).toBe(false);
      expect(result.states).toBeGreaterThan(100);
    });
  });
}
