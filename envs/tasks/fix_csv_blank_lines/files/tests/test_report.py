from report import load_rows, row_count, total_amount

CSV = "id,amount\n1,9.50\n\n2,0.50\n3,10\n\n"


def test_load_rows():
    assert load_rows("id,amount\n1,2\n") == [{"id": "1", "amount": "2"}]


def test_total_with_blank_lines():
    assert total_amount(CSV) == 20.0


def test_row_count():
    assert row_count(CSV) == 3
    assert row_count("id,amount\n") == 0
