"""What the tap recorded of a bench's watched requests: `tap_records.py REQUESTS_LOG EXPECTED TOKENS`
prints (no newline, the caller ends the line) how many records it wrote of EXPECTED requests, how
many have all TOKENS tokens and no error, and the errors by kind."""
import collections
import json
import sys

recs = [json.loads(l) for l in open(sys.argv[1])]
n, t = int(sys.argv[2]), int(sys.argv[3])
exact = sum(1 for r in recs if r.get("completion_tokens") == t and not r.get("error"))
why = collections.Counter(r["error"] for r in recs if r.get("error"))
print(f"tap: {len(recs)} records of {n} streams, {exact} with all {t} tokens, {sum(why.values())} errors {dict(why) if why else ''}", end="")
