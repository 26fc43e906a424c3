# Rails (Active Record): create an order and enqueue its email in ONE transaction.
#
# In a Rails app, `MailroomOutbox` is a model (app/models/mailroom_outbox.rb) and `place_order`
# is what a controller or service calls; mailroom's migrations own the table, so the app has no
# migration for it. This file runs on its own with Active Record alone, which Debian packages:
#
#   apt-get install ruby ruby-activerecord ruby-pg ruby-mysql2      # Active Record 6.1
#   DATABASE_URL=postgres://mailroom:mailroom@127.0.0.1:5432/mailroom \
#       ruby examples/rails_outbox.rb --order-id 1042 --to "Ada <ada@example.com>" [--rollback]
#   DATABASE_URL=mysql://mailroom:mailroom@127.0.0.1:3306/mailroom \
#       ruby examples/rails_outbox.rb --order-id 1042 --to "Ada <ada@example.com>"
#
# Run it twice with the same order id: the second run finds the job already queued and writes
# nothing, as the Python examples do.
require "active_record"
require "optparse"

class ApplicationRecord < ActiveRecord::Base
  self.abstract_class = true
end

class Order < ApplicationRecord
  self.table_name = "rails_orders"
end

class MailroomOutbox < ApplicationRecord
  self.table_name = "mailroom_outbox"
  # JSON on both engines (MariaDB's JSON column is LONGTEXT to Active Record).
  attribute :payload, :json

  # The job (job_id, kind) is in the outbox already: this request was done before.
  class AlreadyQueued < StandardError; end

  # Inserts the job in the caller's transaction; raises AlreadyQueued if its key is taken.
  # The outbox's unique key (job_id, kind) is the idempotency key. PostgreSQL: a duplicate
  # returns no row (INSERT … ON CONFLICT (job_id, kind) DO NOTHING RETURNING id). MySQL /
  # MariaDB: a plain INSERT whose duplicate-key error (1062, the outbox's only unique key
  # besides its id) Active Record raises as RecordNotUnique; InnoDB rolls back that statement
  # only. Not `insert_all` there: on MySQL it is ON DUPLICATE KEY UPDATE, and cannot say which.
  def self.enqueue!(job)
    row = { job_id: job[:job_id], kind: job[:kind], payload: job }
    if connection.adapter_name.match?(/postg/i)
      inserted = insert_all([row], unique_by: %i[job_id kind], returning: %i[id])
      raise AlreadyQueued, job[:job_id] if inserted.rows.empty?
    else
      begin
        create!(row)
      rescue ActiveRecord::RecordNotUnique
        raise AlreadyQueued, job[:job_id]
      end
    end
  end
end

def confirmation_job(order_id, to)
  {
    job_id: "order-#{order_id}-confirmation",
    kind: "order_confirmation",
    to: [to],
    data: {
      product_name: "Acme Store",
      user: { name: to.split("<").first.strip },
      order: {
        id: order_id.to_s, placed_on: Time.now.utc.strftime("%d %B %Y"),
        url: "https://store.acme.example/orders/#{order_id}",
        items: [{ name: "Pour-over kettle", quantity: 1, price: "$39.90" }], total: "$39.90"
      },
      shipping_address: {
        name: "Ada Lovelace", line1: "12 St James's Square", city: "London",
        postal_code: "SW1Y 4JH", country: "United Kingdom"
      }
    }
  }
end

def place_order(order_id, to, rollback: false)
  job = confirmation_job(order_id, to)
  ApplicationRecord.transaction do
    MailroomOutbox.enqueue!(job) # first: a duplicate request stops before it writes anything
    Order.create!(id: order_id, email: to, total: "39.90")
    raise ActiveRecord::Rollback if rollback # leaves the block, rolled back, no exception
  end
  puts(rollback ? "order #{order_id} rolled back: no email" : "order #{order_id} committed: #{job[:job_id]} queued")
rescue MailroomOutbox::AlreadyQueued
  puts "order #{order_id}: job #{job[:job_id]} already exists; nothing written"
end

if $PROGRAM_NAME == __FILE__
  args = { rollback: false }
  OptionParser.new do |o|
    o.on("--order-id ID", Integer) { |v| args[:order_id] = v }
    o.on("--to ADDRESS") { |v| args[:to] = v }
    o.on("--rollback", "roll the transaction back instead") { args[:rollback] = true }
  end.parse!
  abort "usage: ruby #{$PROGRAM_NAME} --order-id ID --to ADDRESS [--rollback]" unless args[:order_id] && args[:to]
  # mailroom's URL says mysql://, Active Record's adapter is mysql2.
  ActiveRecord::Base.establish_connection(ENV.fetch("DATABASE_URL").sub(%r{\Amysql://}, "mysql2://"))
  # The demo's table; a Rails app has a migration for it instead.
  ActiveRecord::Migration.verbose = false
  ActiveRecord::Schema.define do
    create_table :rails_orders, id: :bigint, if_not_exists: true do |t|
      t.string :email, null: false
      t.decimal :total, precision: 10, scale: 2, null: false
    end
  end
  place_order(args[:order_id], args[:to], rollback: args[:rollback])
end
