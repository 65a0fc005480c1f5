import datetime

FORMATS = ("%Y-%m-%d", "%d/%m/%Y")


def parse_timestamp(text):
    for fmt in FORMATS:
        try:
            return datetime.datetime.strptime(text.strip(), fmt)
        except ValueError:
            pass
    raise ValueError(f"unrecognised date: {text!r}")
