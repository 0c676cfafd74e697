// The AsyncAPI documents in docs/asyncapi/ through the official parser (@asyncapi/parser, its
// default Spectral ruleset): every diagnostic is printed, and an error or a warning fails the
// check (exit 1). scripts/test runs it; `npm ci` in this folder installs the locked parser.
import { readFile, readdir } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Parser } from "@asyncapi/parser";

const here = dirname(fileURLToPath(import.meta.url));
const folder = resolve(here, "..", "..", "docs", "asyncapi");
const SEVERITY = ["error", "warning", "information", "hint"];

const parser = new Parser();
const files = (await readdir(folder)).filter((name) => name.endsWith(".yaml")).sort();
let failed = 0;
for (const name of files) {
  const path = join(folder, name);
  const { document, diagnostics } = await parser.parse(await readFile(path, "utf8"), {
    source: path,
  });
  const counts = [0, 0, 0, 0];
  for (const diagnostic of diagnostics) {
    counts[diagnostic.severity] += 1;
    const where = diagnostic.path.join(".") || "(document)";
    console.log(`  ${name}: ${SEVERITY[diagnostic.severity]} ${diagnostic.code} at ${where}: ${diagnostic.message}`);
  }
  const bad = counts[0] + counts[1] + (document === undefined ? 1 : 0);
  failed += bad;
  console.log(
    `${name}: ${document === undefined ? "NOT PARSED" : "parsed"}, ${counts[0]} errors, ${counts[1]} warnings, ${counts[2]} information, ${counts[3]} hints`,
  );
}
if (files.length === 0) {
  console.log(`no AsyncAPI document in ${folder}`);
  process.exit(1);
}
process.exit(failed === 0 ? 0 : 1);
