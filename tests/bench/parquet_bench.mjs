// DuckDB side of tests/bench/parquet-bench.sh. Usage:
//   node parquet_bench.mjs gen DIR ROWS   -> DIR/bench_snappy.parquet, DIR/bench_zstd.parquet
//   node parquet_bench.mjs time FILE      -> seconds for one single-threaded full decode of h
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'js', 'package.json'));
const { DuckDBInstance } = require('@duckdb/node-api');

const [mode, a, b] = process.argv.slice(2);
const db = await DuckDBInstance.create(':memory:', {
  autoinstall_known_extensions: 'false', autoload_known_extensions: 'false',
});
const con = await db.connect();
if (mode === 'gen') {
  const rows = Number(b);
  const q = `SELECT sha256(i::VARCHAR) AS h, i::BIGINT AS id, (i * 7919) % 100003 AS n,
    'k' || (i % 1000)::VARCHAR AS cat, (i % 86400000)::BIGINT AS ts FROM range(${rows}) r(i)`;
  for (const codec of ['snappy', 'zstd'])
    await con.run(`COPY (${q}) TO '${a}/bench_${codec}.parquet' (FORMAT parquet, COMPRESSION ${codec})`);
} else if (mode === 'time') {
  await con.run('SET threads=1');
  const t0 = performance.now();
  const r = await con.runAndReadAll(`SELECT count(h), sum(length(h)) FROM read_parquet('${a}')`);
  const t1 = performance.now();
  console.error(`duckdb: ${r.getRows()[0].join(' ')}`);
  console.log(((t1 - t0) / 1000).toFixed(3));
}
