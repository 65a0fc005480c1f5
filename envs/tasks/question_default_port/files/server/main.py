from server.config import resolve_port


def main():
    print(f"listening on {resolve_port()}")


if __name__ == "__main__":
    main()
