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

/**
 * The stripe (0 to `stripes` - 1) execution number `id` draws, as a caller of a lock split into stripes
 * draws one at random: a hash of the number, so that every design of a run gets the same draws.
 */
export function stripeOf(id: number, stripes: number): number {
  let x = (id + 0x9e3779b9) | 0;
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return Math.floor((((x ^ (x >>> 16)) >>> 0) / 2 ** 32) * stripes);
}
/* eslint-enable no-bitwise */

/** True with probability `p`. */
export function chance(random: Random, p: number): boolean {
  return p > 0 && random() < p;
}
