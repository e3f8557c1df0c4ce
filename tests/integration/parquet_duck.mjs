// DuckDB side of the Parquet cross-checks. Usage:
//   node parquet_duck.mjs read FILE            -> JSON {columns:[{name,type,values}]} (flat columns)
//   node parquet_duck.mjs sql "SQL"            -> runs statements (e.g. COPY ... TO ...)
//   node parquet_duck.mjs query "SQL"          -> JSON rows of the first column, as strings
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'js', 'package.json'));
const { DuckDBInstance } = require('@duckdb/node-api');

const [mode, arg] = process.argv.slice(2);
const db = await DuckDBInstance.create(':memory:', {
  autoinstall_known_extensions: 'false', autoload_known_extensions: 'false', threads: '1',
});
const con = await db.connect();
const ident = (s) => '"' + s.replaceAll('"', '""') + '"';
const lit = (s) => "'" + s.replaceAll("'", "''") + "'";
const INTS = new Set(['TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'UTINYINT', 'USMALLINT',
  'UINTEGER', 'UBIGINT']);

async function column(sql) {
  const r = await con.runAndReadAll(sql);
  return r.getRows().map((row) => (row[0] === null ? null : String(row[0])));
}

if (mode === 'read') {
  const src = `read_parquet(${lit(arg)})`;
  let desc;
  try {
    desc = (await con.runAndReadAll(`DESCRIBE SELECT * FROM ${src}`)).getRows();
  } catch (e) {
    console.log(JSON.stringify({ columns: [], error: String(e.message || e) }));
    process.exit(0);
  }
  const out = [];
  for (const [name, type] of desc) {
    let expr = null;
    if (type === 'VARCHAR' || type === 'BLOB') expr = `hex(${ident(name)})`;
    else if (type === 'UUID') expr = `replace(CAST(${ident(name)} AS VARCHAR), '-', '')`;
    else if (INTS.has(type)) expr = `CAST(${ident(name)} AS VARCHAR)`;
    if (!expr) { out.push({ name, type, values: null }); continue; }
    try {
      out.push({ name, type, values: await column(`SELECT ${expr} FROM ${src}`) });
    } catch (e) {
      out.push({ name, type, values: null, error: String(e.message || e) });
    }
  }
  console.log(JSON.stringify({ columns: out }));
} else if (mode === 'sql') {
  await con.run(arg);
  console.log('{}');
} else if (mode === 'query') {
  console.log(JSON.stringify(await column(arg)));
} else {
  console.error('usage: parquet_duck.mjs read FILE | sql SQL | query SQL');
  process.exit(2);
}
