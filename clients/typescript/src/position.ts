// A database position (PostgreSQL's pg_lsn text, "16/B374D848"): two hexadecimal numbers,
// compared high then low (schemas/position.py).
const PATTERN = /^[0-9A-Fa-f]{1,8}\/[0-9A-Fa-f]{1,8}$/;

export function positionValue(position: string): bigint {
  if (!PATTERN.test(position)) throw new Error(`not a database position: ${position.slice(0, 40)}`);
  const [high, low] = position.split("/") as [string, string];
  return (BigInt(`0x${high}`) << 32n) | BigInt(`0x${low}`);
}

/** The later of two positions (`null` ones ignored). */
export function latest(a: string | null, b: string | null): string | null {
  if (a === null) return b;
  if (b === null) return a;
  return positionValue(b) > positionValue(a) ? b : a;
}
