import csv

from importer import dates, money


def import_rows(lines):
    out = []
    for row in csv.DictReader(lines):
        out.append({
            "when": dates.parse_timestamp(row["date"]),
            "amount": money.parse_amount(row["amount"]),
        })
    return out
