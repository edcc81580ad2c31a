"""The report: gpu_report.md and gpu_report.json, rewritten after every section."""
import json
import os


def write_report(out, results, meta):
    with open(os.path.join(out, 'gpu_report.json'), 'w') as f:
        json.dump({'meta': meta, 'sections': results}, f, indent=2, default=str)
    env = next((r['data'] for r in results if r['key'] == 'environment'), {})
    lines = [f'# GPU check: {env.get("gpu", "?")}, torch {env.get("torch", "?")}, commit {env.get("commit", "?")}',
             '', f'{env.get("date", "")}; `{meta["command"]}`{" (dry run)" if meta["dry_run"] else ""}; '
             f'{meta["elapsed_s"]:.0f} s in all.', '', '| section | status | seconds |', '| --- | --- | --- |']
    lines += [f'| {r["number"]}. {r["title"]} | {r["status"]} | {r["seconds"]:.0f} |' for r in results]
    for r in results:
        lines += ['', f'## {r["number"]}. {r["title"]}: {r["status"]}', '', r['summary'] or '']
    with open(os.path.join(out, 'gpu_report.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
