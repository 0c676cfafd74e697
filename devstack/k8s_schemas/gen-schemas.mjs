// One-off vendoring step (needs npm, not needed in CI): turn the TypeScript interfaces shipped in
// @kubernetes-models/* into standalone JSON Schemas under <out>/<group>/<kind>_<version>.json
// (kubeconform / CRDs-catalog layout) plus <out>/SOURCES.json recording package@version.
// usage (from devstack/k8s_schemas): npm ci && node gen-schemas.mjs ../../k8s/schemas
import { createGenerator } from "ts-json-schema-generator";
import { mkdirSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const OUT = path.resolve(process.argv[2] || "schemas");
// [npm package, group, version, kind]  -- add a line per CR kind used in k8s/
const KINDS = [
  ["@kubernetes-models/keda", "keda.sh", "v1alpha1", "ScaledObject"],
  ["@kubernetes-models/strimzi-kafka-operator", "kafka.strimzi.io", "v1beta2", "KafkaTopic"],
  ["@kubernetes-models/cloudnative-pg", "postgresql.cnpg.io", "v1", "Cluster"],
  ["@kubernetes-models/prometheus-operator", "monitoring.coreos.com", "v1", "PodMonitor"],
  ["@kubernetes-models/prometheus-operator", "monitoring.coreos.com", "v1", "PrometheusRule"],
];

// `{}` in the .d.ts (x-kubernetes-preserve-unknown-fields) must stay open: drop
// additionalProperties:false where an object schema declares no properties at all.
function reopenFreeForm(node) {
  if (Array.isArray(node)) return node.forEach(reopenFreeForm);
  if (!node || typeof node !== "object") return;
  if (node.additionalProperties === false && !node.properties && !node.patternProperties) delete node.additionalProperties;
  Object.values(node).forEach(reopenFreeForm);
}

const sources = {};
for (const [pkg, group, version, kind] of KINDS) {
  const pkgVersion = JSON.parse(readFileSync(path.join(HERE, "node_modules", pkg, "package.json"))).version;
  const tmp = path.join(HERE, `.gen-${kind}.ts`);
  writeFileSync(tmp, `export type { I${kind} } from "${pkg}/${group}/${version}/${kind}";\n`);
  try {
    const schema = createGenerator({
      path: tmp, type: `I${kind}`, expose: "none", topRef: false, skipTypeCheck: true,
      additionalProperties: false, jsDoc: "basic",
      tsconfig: path.join(HERE, "tsconfig.gen.json"),
    }).createSchema(`I${kind}`);
    reopenFreeForm(schema);
    schema.$comment = `generated from npm ${pkg}@${pkgVersion} (${group}/${version} ${kind}) by gen-schemas.mjs`;
    const rel = `${group}/${kind.toLowerCase()}_${version}.json`;
    mkdirSync(path.join(OUT, group), { recursive: true });
    writeFileSync(path.join(OUT, rel), JSON.stringify(schema, null, 1) + "\n");
    sources[rel] = { package: pkg, version: pkgVersion, apiVersion: `${group}/${version}`, kind };
    console.log("wrote", rel);
  } finally { rmSync(tmp, { force: true }); }
}
writeFileSync(path.join(OUT, "SOURCES.json"), JSON.stringify(sources, null, 2) + "\n");
