// Validates generated outputs against their JSON schemas with ajv (+ ajv-formats): the oracle of the grammar
// tests. Usage: node ajv_validate.mjs CASES.json, where CASES.json is [{"name", "schema", "outputs": [text...]}]
// (NODE_PATH-free: ajv is loaded from $KILN_NPM_DIR/node_modules). Draft 2020-12 unless a schema uses the draft-7
// tuple form (an array under "items"). Prints one line per failure; exit code 1 if any output is not valid JSON
// or does not validate.
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';

const require = createRequire(path.resolve(process.env.KILN_NPM_DIR || process.cwd(), 'node_modules', 'x.js'));
const Ajv2020 = require('ajv/dist/2020').default;
const Ajv07 = require('ajv').default;
const addFormats = require('ajv-formats').default;

const usesDraft7Tuples = (s) => {
  if (Array.isArray(s)) return s.some(usesDraft7Tuples);
  if (s && typeof s === 'object') {
    if (Array.isArray(s.items)) return true;
    return Object.values(s).some(usesDraft7Tuples);
  }
  return false;
};

const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
let failures = 0, outputs = 0;
for (const c of cases) {
  const ajv = usesDraft7Tuples(c.schema) ? new Ajv07({ strict: false, allErrors: true })
                                         : new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  let validate;
  try {
    validate = ajv.compile(c.schema === true ? {} : c.schema);
  } catch (e) {
    console.log(`${c.name}: ajv cannot compile the schema: ${e.message}`);
    failures++;
    continue;
  }
  for (const text of c.outputs) {
    outputs++;
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      console.log(`${c.name}: not JSON: ${e.message}: ${JSON.stringify(text)}`);
      failures++;
      continue;
    }
    if (!validate(value)) {
      console.log(`${c.name}: invalid: ${ajv.errorsText(validate.errors)}: ${JSON.stringify(text)}`);
      failures++;
    }
  }
}
console.log(`ajv: ${outputs - failures} of ${outputs} outputs of ${cases.length} schemas valid`);
process.exit(failures ? 1 : 0);
