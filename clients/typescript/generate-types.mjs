// The TypeScript types of every message, generated from docs/schemas/ (one module each under
// src/types/, its nested types beside it). `npm run types` writes them; `--check` exits 1 when
// a committed module is not what the schemas give (scripts/test runs the check).
import { mkdir, readFile, readdir, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { compile } from "json-schema-to-typescript";

const here = dirname(fileURLToPath(import.meta.url));
const schemas = resolve(here, "..", "..", "docs", "schemas");
const out = join(here, "src", "types");
const check = process.argv.includes("--check");

await mkdir(out, { recursive: true });
let stale = 0;
for (const file of (await readdir(schemas)).filter((n) => n.endsWith(".schema.json")).sort()) {
  const schema = JSON.parse(await readFile(join(schemas, file), "utf8"));
  const name = file.replace(".schema.json", "");
  const text = await compile(schema, schema.title ?? name, {
    bannerComment: `// Generated from docs/schemas/${file} by generate-types.mjs: do not edit.`,
    additionalProperties: false,
    cwd: schemas,
    declareExternallyReferenced: true,
    unreachableDefinitions: false,
    style: { printWidth: 100 },
  });
  const path = join(out, `${name}.ts`);
  if (check) {
    const committed = await readFile(path, "utf8").catch(() => "");
    if (committed !== text) {
      console.log(`clients/typescript/src/types/${name}.ts is stale: run npm run types`);
      stale += 1;
    }
  } else {
    await writeFile(path, text);
  }
}
const expected = new Set(
  (await readdir(schemas)).filter((n) => n.endsWith(".schema.json")).map((n) => n.replace(".schema.json", ".ts")),
);
for (const left of (await readdir(out)).filter((n) => !expected.has(n))) {
  console.log(`clients/typescript/src/types/${left} has no schema any more: run npm run types`);
  stale += 1;
}
process.exit(stale === 0 ? 0 : 1);
