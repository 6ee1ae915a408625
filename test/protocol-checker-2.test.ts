import { describeCheckerShard } from './checker-shard';

/*
 * The second half of the protocol checker's bounded configurations (the first half, and the checker
 * finding planted races, are in test/protocol-checker.test.ts): a file of its own, so that Jest runs
 * the two halves on its two workers.
 */

jest.setTimeout(15 * 60 * 1000);

describeCheckerShard(2);
