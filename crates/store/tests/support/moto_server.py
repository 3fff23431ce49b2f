"""moto's server (python -m moto.server) with one fix to its signature check.

moto 5.x checks SigV4 over the query string as it decoded it (`prefix=qwen3/`), where AWS,
botocore and lmi sign it encoded (`prefix=qwen3%2F`), so that even boto3's own
ListObjectsV2 with a `/` in the prefix fails against it with SignatureDoesNotMatch. This
re-encodes the query (RFC 3986, as SigV4 wants) before moto's check; the rest is moto's.
"""

import sys
from urllib.parse import quote, unquote

from moto.iam import access_control
from moto.server import main

_init = access_control.IAMRequestBase.__init__


def _init_encoded(self, account_id, method, path, data, body, headers, action):
    base, sep, query = path.partition("?")
    if sep:
        pairs = []
        for part in query.split("&"):
            key, eq, value = part.partition("=")
            pairs.append(quote(unquote(key), safe="-_.~") + eq + quote(unquote(value), safe="-_.~"))
        path = base + "?" + "&".join(pairs)
    _init(self, account_id, method, path, data, body, headers, action)


access_control.IAMRequestBase.__init__ = _init_encoded

if __name__ == "__main__":
    sys.exit(main())
