"""Sales report from exported CSV text."""
import csv
import io


def load_rows(text):
    """Parse CSV text with a header row into a list of dicts."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    return [dict(zip(header, row)) for row in reader]


def total_amount(text):
    return round(sum(float(row["amount"]) for row in load_rows(text)), 2)


def row_count(text):
    return len(text.strip().splitlines())
