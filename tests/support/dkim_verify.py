#!/usr/bin/python3
"""Verifies the DKIM signature of one message with dkimpy (Debian's python3-dkim), offline.

    dkim_verify.py MESSAGE_FILE TXT_RECORD

TXT_RECORD is the record published at <selector>._domainkey.<domain> (e.g. "v=DKIM1; k=ed25519;
p=..."); the lookup of any name answers with it, so no DNS is involved. Prints the signature's
d= and s= and exits 0 when it verifies, 1 when it does not.
"""
import re
import sys

import dkim


def main():
    message = open(sys.argv[1], "rb").read()
    record = sys.argv[2].encode()

    def dns(name, timeout=5):
        return record

    import logging
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    ok = dkim.verify(message, dnsfunc=dns, logger=logging.getLogger("dkim"))
    sig = re.search(rb"DKIM-Signature:.*?(?=\r\n\S)", message, re.S | re.I)
    tags = sig.group(0).decode() if sig else "no DKIM-Signature header"
    print(("verified: " if ok else "NOT verified: ") + " ".join(tags.split()))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
