/**
 * A small seeded pseudo-random generator (mulberry32), so that a simulation run with the same seed
 * draws the same jitter and injects the same faults.
 */
export type Random = () => number;

// A PRNG is bit arithmetic by nature.
/* eslint-disable no-bitwise */
export function seededRandom(seed: number): Random {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
/* eslint-enable no-bitwise */

/** True with probability `p`. */
export function chance(random: Random, p: number): boolean {
  return p > 0 && random() < p;
}
