"""Kafka Connect converter settings for the test registry (Apicurio Registry 2.6).

Connect workers in the tests and benchmarks write Avro through Apicurio's own
AvroConverter. These settings make it write Confluent's wire format (magic byte 0
and a 4-byte schema id in the payload, not in headers), with the id that the
registry's Confluent-compatible API serves (/schemas/ids/ID: the contentId), so
ubik's `format=avro&registry=` and `format=debezium-avro&registry=` read it.
"""


def avro_converters(ccompat_url):
    """Key and value converter settings; `ccompat_url` is the registry's
    Confluent-compatible base URL (…/apis/ccompat/v7)."""
    api = ccompat_url.replace("/apis/ccompat/v7", "/apis/registry/v2")
    conf = {}
    for side in ("key", "value"):
        p = f"{side}.converter"
        conf |= {p: "io.apicurio.registry.utils.converter.AvroConverter",
                 f"{p}.apicurio.registry.url": api,
                 f"{p}.apicurio.registry.auto-register": "true",
                 f"{p}.apicurio.registry.find-latest": "true",
                 f"{p}.apicurio.registry.as-confluent": "true",
                 f"{p}.apicurio.registry.use-id": "contentId",
                 f"{p}.apicurio.registry.headers.enabled": "false"}
    return conf
