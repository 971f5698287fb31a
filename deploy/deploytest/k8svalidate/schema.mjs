// Validates Kubernetes objects against the schemas of the Kubernetes OpenAPI
// spec, as compiled (ajv) by the kubernetes-models package: types, required
// fields, formats, int-or-string and enums.
//
// Usage: node schema.mjs OBJECTS.json
// OBJECTS.json is [{"where": "...", "object": {...}}, ...]. Prints one line
// per object ("ok WHERE" or "invalid WHERE: reasons") and exits 1 when any
// object is invalid or of a kind the package does not know.
import { readFileSync } from "node:fs";

const items = JSON.parse(readFileSync(process.argv[2], "utf8"));
let failed = 0;
for (const { where, object } of items) {
  const kind = object?.kind;
  const apiVersion = object?.apiVersion;
  if (typeof kind !== "string" || typeof apiVersion !== "string") {
    console.log(`invalid ${where}: no apiVersion/kind`);
    failed++;
    continue;
  }
  let Model;
  try {
    Model = (await import(`kubernetes-models/${apiVersion}/${kind}`))[kind];
  } catch (e) {
    console.log(`invalid ${where}: unknown kind ${apiVersion} ${kind} (${e.code ?? e.message})`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok ${where}`);
  } catch (e) {
    console.log(`invalid ${where}: ${e.message.replaceAll("\n", "; ")}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
